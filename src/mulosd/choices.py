"""The named choices the schemas check against and the code dispatches on: one place, no imports (so that the
models and the torch-free schemas read the same tuple)."""

RATIOS = (2, 4)  # r: the verifier's grid over the drafter's
SAMPLER_STAGES = ("token_ce", "mse_lpips", "gan")  # the up-sampler's loss stages, in training order
SAMPLER_KINDS = ("up", "down", "sr")  # what train.py's sampler model trains: U_r, D_r, the pixel path's SR network
TRAINING_FREE_SR = ("bicubic", "lanczos")  # sr= choices that need no weights (samplers/pixel.py)
UPSAMPLER_BASES = ("none", "bicubic")  # what U_r corrects: nothing, or the pixel path's bicubic (samplers/latent.py)
GUIDANCE_SCHEDULES = ("constant", "linear")  # the guidance scale along the raster (ar/backbone.py)
BACKBONES = ("synthscenes", "llamagen_t2i", "tar")
WANDB_MODES = ("online", "offline", "disabled")
LOGGERS = ("wandb", "csv", "none")
TASKS = ("fit", "inspect_data", "export")
