"""Tar's LLM stage: a prompt -> TA-Tok ids, as upstream's t2i_inference does it.

The chat-templated prompt (a system and a user turn) ends with `<im_start><S{scale}>`; the LLM (Qwen2.5 with
Tar's added tokens) samples up to n new tokens (n = 729, 169, 81 for scale 0, 1, 2; temperature 1.0, top-p
0.95, top-k 1200 by default); the ids are read back from `<I{id}>` tokens, truncated or zero-padded to n. No
CFG on the LLM side. Each prompt is sampled alone with a generator seeded by (seed, image id), so an image's
features do not depend on its batch. Needs `transformers`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch

from .ar_dtok import PREFIXES

LLM_REPOS = {"1.5B": "csuhan/Tar-1.5B", "7B": "csuhan/Tar-7B-v0.1"}
SYSTEM = "You are a helpful assistant."


@dataclass(frozen=True)
class LLMSampling:
    temperature: float = 1.0
    top_p: float = 0.95
    top_k: int = 1200


def read_ids(text: str, n: int) -> list[int]:
    """The TA-Tok ids in generated text (`<I{id}>` tokens), truncated or zero-padded to n."""
    ids = [int(x) for x in re.findall(r"<I(\d+)>", text)][:n]
    return ids + [0] * (n - len(ids))


class TarLLM:
    def __init__(self, name_or_path: str, device="cpu", dtype=torch.float32, sampling: LLMSampling = LLMSampling()):
        from .checkpoints import MissingCheckpoints

        try:
            from transformers import AutoModelForCausalLM, AutoTokenizer
        except ImportError:
            raise MissingCheckpoints("Tar's LLM stage needs `pip install transformers`") from None
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(name_or_path)
            self.model = AutoModelForCausalLM.from_pretrained(name_or_path, dtype=dtype).to(device).eval()
        except OSError:
            raise MissingCheckpoints(f"missing Tar's LLM {name_or_path!r}: not in the Hugging Face cache and the hub "
                                     f"is unreachable; give a local copy with tar.llm=DIR") from None
        self.device, self.sampling = device, sampling

    def prompt_text(self, prompt: str, scale: int) -> str:
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": prompt}]
        text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return text + f"<im_start><S{scale}>"

    @torch.no_grad()
    def ids(self, prompts: list[str], scale: int, seed: int, image_ids: torch.Tensor) -> torch.Tensor:
        """TA-Tok ids [B, n] for the prompts, n = the token count of `scale`."""
        n, s = PREFIXES[scale], self.sampling
        out = []
        for prompt, image in zip(prompts, image_ids.tolist(), strict=True):
            inputs = self.tokenizer(self.prompt_text(prompt, scale), return_tensors="pt").to(self.device)
            torch.manual_seed(hash((seed, image)) % 2 ** 63)  # generate() draws from the global generator
            gen = self.model.generate(inputs.input_ids, attention_mask=inputs.attention_mask, max_new_tokens=n,
                                      do_sample=True, temperature=s.temperature, top_p=s.top_p, top_k=s.top_k)
            out.append(read_ids(self.tokenizer.decode(gen[0, inputs.input_ids.shape[1]:]), n))
        return torch.tensor(out, dtype=torch.long)
