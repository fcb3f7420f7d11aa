# VALIDATE_PRELUDE for the GPU scenario: Hopper's cuDNN pick out of the way, so flash is default.
import torch

torch.backends.cuda.enable_cudnn_sdp(False)
