"""Tar (TA-Tok + AR-DTok): the paper's main backbone. An LLM writes TA-Tok ids for a prompt, TA-Tok turns them
into SigLIP2-width features, and two AR-DTok de-tokenizers (256 px drafter; 512 or 1024 px verifier) generate
LlamaGen VQ-16 tokens conditioned on them."""
