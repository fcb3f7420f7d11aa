# VALIDATE_PRELUDE for the GPU scenario: what a user's stray enable_flash_sdp(False) does.
import torch

torch.backends.cuda.enable_flash_sdp(False)
