# VALIDATE_PRELUDE for the GPU scenario: cuDNN and flash disabled, as a stray enable_flash_sdp(False) does.
import torch

torch.backends.cuda.enable_cudnn_sdp(False)
torch.backends.cuda.enable_flash_sdp(False)
