"""Adapters for real Hugging Face components (full scale, GPU): a ``transformers`` tokenizer and ``diffusers``
pipelines behind the interfaces :class:`~icml24.next_gpt.model.NExTGPT` uses. Tested with tiny random-init
components (``tests/next_gpt/test_hf.py``); not exercised with real weights here (none can be downloaded in this
environment).
"""

from __future__ import annotations

from typing import Any

import torch


class HFTokenizer:
    """A ``transformers`` tokenizer with the word-level interface NExT-GPT uses (``stoi``/``itos``, ``encode``,
    ``decode``, ``add_tokens``, ``convert_tokens_to_ids``); ``###``, ``human:``, ``assistant:`` are added as tokens."""

    def __init__(self, tokenizer: Any) -> None:
        self.hf = tokenizer
        self.hf.add_tokens(["###", "human:", "assistant:"])
        self.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self.bos_token_id = tokenizer.bos_token_id
        self.unk_token_id = tokenizer.unk_token_id
        self._sync()

    def _sync(self) -> None:
        self.stoi = dict(self.hf.get_vocab())
        self.itos = [""] * (max(self.stoi.values()) + 1)
        for w, i in self.stoi.items():
            self.itos[i] = w

    def __len__(self) -> int:
        return len(self.hf)

    def add_tokens(self, tokens: list[str]) -> int:
        n = self.hf.add_tokens(tokens, special_tokens=True)
        self._sync()
        return n

    def convert_tokens_to_ids(self, tokens: list[str]) -> list[int]:
        return self.hf.convert_tokens_to_ids(tokens)

    def encode(self, text: str) -> list[int]:
        return self.hf.encode(text, add_special_tokens=False)

    def decode(self, ids: Any, *, skip_special_tokens: bool = True) -> str:
        return self.hf.decode(ids, skip_special_tokens=skip_special_tokens)


class DiffusersDecoder(torch.nn.Module):
    """A ``diffusers`` text-conditioned pipeline as a NExT-GPT decoder: ``encode_condition`` runs the pipeline's own
    text encoder (SD: CLIP ``last_hidden_state`` 77x768; AudioLDM: the normalised CLAP text embedding, 1x512),
    ``generate`` calls the pipeline with ``prompt_embeds``."""

    def __init__(self, modality: str, pipeline: Any, *, n_tokens: int = 77, pooled: bool = False,
                 **call_kwargs: Any) -> None:
        super().__init__()
        self.modality = modality
        self.pipe = pipeline
        self.pooled = pooled
        self.call_kwargs = call_kwargs
        dim = pipeline.text_encoder.config.projection_dim if pooled else pipeline.text_encoder.config.hidden_size
        self._cond_shape = (1 if pooled else n_tokens, dim)

    @property
    def cond_shape(self) -> tuple[int, int]:
        return self._cond_shape

    @torch.no_grad()
    def encode_condition(self, captions: list[str]) -> torch.Tensor:
        tok = self.pipe.tokenizer(captions, padding="max_length", max_length=self.pipe.tokenizer.model_max_length,
                                  truncation=True, return_tensors="pt").to(self.pipe.device)
        out = self.pipe.text_encoder(**tok)
        if self.pooled:  # AudioLDM: normalised CLAP text embeds
            e = torch.nn.functional.normalize(out.text_embeds, dim=-1)
            return e[:, None]
        return out.last_hidden_state

    @torch.no_grad()
    def generate(self, cond: torch.Tensor, *, guidance_scale: float = 7.5, steps: int = 40,
                 seed: int = 0) -> torch.Tensor:
        """Media from conditioning states ``cond`` (B, *cond_shape), as a tensor: images (B, 3, H, W), video
        frames (B, F, 3, H, W), audio (B, samples); the pipeline's ``output_type`` defaults to ``"pt"``."""
        if cond.ndim != 3 or tuple(cond.shape[1:]) != self.cond_shape:
            raise ValueError(f"DiffusersDecoder[{self.modality}]: cond must have shape (B, {self.cond_shape[0]}, "
                             f"{self.cond_shape[1]}), got {tuple(cond.shape)}")
        g = torch.Generator(device=self.pipe.device).manual_seed(seed)
        emb = cond[:, 0] if self.pooled else cond
        out = self.pipe(prompt_embeds=emb, guidance_scale=guidance_scale, num_inference_steps=steps, generator=g,
                        **({"output_type": "pt"} | self.call_kwargs))
        for name in ("images", "frames", "audios"):
            if hasattr(out, name):
                return torch.as_tensor(getattr(out, name))
        raise TypeError(f"DiffusersDecoder[{self.modality}]: the pipeline returned {type(out).__name__} without "
                        "images, frames or audios")
