"""Command-line reports on trained models (python -m mulosd.reports.tokenizer | .ar | .samplers): each
evaluates on held-out SynthScenes scenes and prints a table and one summary line. They sit above the model
packages and the zoo, which never import them."""
