"""The Hugging Face adapters with tiny random-init components built offline: a ``transformers`` fast tokenizer
behind NExT-GPT, and a ``diffusers`` Stable Diffusion pipeline as a decoder fed by NExT-GPT's output projector."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from icml24.next_gpt import world as W
from icml24.next_gpt.components import Frozen, FrozenConfig, JointEncoder, build_llm
from icml24.next_gpt.hf import DiffusersDecoder, HFTokenizer
from icml24.next_gpt.model import NExTGPT, NExTGPTConfig

pytest.importorskip("tokenizers")
diffusers = pytest.importorskip("diffusers")


def _fast_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(dict.fromkeys(["<pad>", "<s>", "<unk>", *W.vocabulary()]))}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="<pad>", bos_token="<s>", unk_token="<unk>")


def _tiny_sd_pipeline(tmp_path):
    from diffusers import AutoencoderKL, DDIMScheduler, StableDiffusionPipeline, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTokenizer

    vocab = {"<|startoftext|>": 0, "<|endoftext|>": 1}
    for w in sorted({w for c in W.IMAGE.combos() for w in W.IMAGE.caption(c).split()}):
        vocab[w + "</w>"] = len(vocab)
    for ch in "abcdefghijklmnopqrstuvwxyz":
        vocab.setdefault(ch, len(vocab))
        vocab.setdefault(ch + "</w>", len(vocab))
    (tmp_path / "vocab.json").write_text(json.dumps(vocab))
    (tmp_path / "merges.txt").write_text("#version: 0.2\n")
    tok = CLIPTokenizer(str(tmp_path / "vocab.json"), str(tmp_path / "merges.txt"), model_max_length=8)
    torch.manual_seed(0)
    te = CLIPTextModel(CLIPTextConfig(vocab_size=len(vocab), hidden_size=32, intermediate_size=37, projection_dim=32,
                                      num_attention_heads=4, num_hidden_layers=1, max_position_embeddings=8))
    unet = UNet2DConditionModel(block_out_channels=(32, 32), layers_per_block=1, sample_size=8, in_channels=4,
                                out_channels=4, down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
                                up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"), cross_attention_dim=32,
                                norm_num_groups=8)
    vae = AutoencoderKL(block_out_channels=(8,), in_channels=3, out_channels=3, latent_channels=4,
                        down_block_types=("DownEncoderBlock2D",), up_block_types=("UpDecoderBlock2D",),
                        norm_num_groups=8, sample_size=16)
    pipe = StableDiffusionPipeline(vae=vae, text_encoder=te, tokenizer=tok, unet=unet,
                                   scheduler=DDIMScheduler(clip_sample=False, steps_offset=1), safety_checker=None,
                                   feature_extractor=None, requires_safety_checker=False)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def test_hf_tokenizer_round_trip_and_nextgpt_tokens():
    tok = HFTokenizer(_fast_tokenizer())
    text = "human: show me a red circle ###"
    assert tok.decode(tok.encode(text)) == text
    n = len(tok)
    assert tok.add_tokens(["<img>", "[IMG0]"]) == 2 and len(tok) == n + 2
    assert tok.convert_tokens_to_ids(["[IMG0]"]) == [n + 1] and tok.itos[n + 1] == "[IMG0]"


def test_diffusers_decoder_behind_nextgpt_output_projector(tmp_path):
    dec = DiffusersDecoder("image", _tiny_sd_pipeline(tmp_path), n_tokens=8, height=8, width=8)
    assert dec.cond_shape == (8, 32)
    c = dec.encode_condition(["a small red circle", "a large blue square"])
    assert c.shape == (2, 8, 32) and not torch.allclose(c[0], c[1])
    with pytest.raises(ValueError, match=r"cond must have shape \(B, 8, 32\)"):
        dec.generate(c[:, :4])

    tok = HFTokenizer(_fast_tokenizer())
    fcfg = FrozenConfig(modalities=("image",), embed_dim=16)
    llm = build_llm(vocab_size=len(tok), hidden=32, layers=1, heads=4, seed=0)  # transformers LlamaForCausalLM
    frozen = Frozen(fcfg, tok, llm, JointEncoder(("image",), len(tok), 16), {"image": dec}, {}, {})
    model = NExTGPT(frozen=frozen, config=NExTGPTConfig(modalities=("image",), n_signal=(4,), projector_hidden=16),
                    seed=0)
    out = model.generate(inputs=["show me a red circle"], max_new_tokens=3, ddim_steps=2)
    assert isinstance(out.text, str)
    h = torch.randn(1, 4, model.d_llm)
    cond = model.project("image", h, torch.tensor([model.signal_ids["image"]]))
    assert cond.shape == (1, *dec.cond_shape)
    x = dec.generate(cond.detach(), steps=2, guidance_scale=2.0)
    assert x.shape == (1, 3, 8, 8) and np.isfinite(x.numpy()).all()
