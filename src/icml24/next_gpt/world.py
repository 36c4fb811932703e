"""A seeded synthetic multimodal world (notes §5.1): images, videos and audio with attribute captions,
instruction templates, implicit-attribute facts and multi-turn modality-switching dialogues (MosIT).

Every modality is a :class:`ModalitySpec`: its attributes, its tensor shape, a renderer ``attrs -> tensor`` and a
caption ``attrs -> str``; the rest of the package (encoders, decoders, oracles, NExT-GPT) is generic over specs.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np
import torch

SIZE = 16  # image side (decoders and encoders work at 16x16)
SAMPLE_RATE = 8000  # audio sample rate (Hz)
AUDIO_SECONDS = 0.5
N_MELS = 16
N_FRAMES_AUDIO = 16
VIDEO_FRAMES = 4

COLOURS = {"red": (1.0, 0.1, 0.1), "green": (0.1, 0.9, 0.1), "blue": (0.15, 0.3, 1.0), "yellow": (1.0, 0.9, 0.1)}
SHAPES = ("circle", "square", "triangle", "cross")
SIZES = ("small", "large")
MOTIONS = ("left", "right", "up", "down")
PITCHES = {"low": 220.0, "mid": 440.0, "high": 880.0}
TIMBRES = ("sine", "square", "saw")
RHYTHMS = ("steady", "pulsing")

# implicit attributes: "the colour of the sky" = blue (stated indirectly; resolved by the LLM from pretraining facts)
COLOUR_THINGS = {"red": ("fire", "a tomato"), "green": ("grass", "a leaf"), "blue": ("the sky", "the sea"),
                 "yellow": ("the sun", "a banana")}
SIZE_THINGS = {"small": ("a mouse", "an ant"), "large": ("an elephant", "a whale")}
PITCH_THINGS = {"low": ("a drum", "a bear"), "mid": ("a voice", "a bell"), "high": ("a bird", "a whistle")}
MOTION_THINGS = {"left": ("the past",), "right": ("the future",), "up": ("a rocket",), "down": ("the rain",)}


@dataclass(frozen=True)
class ModalitySpec:
    """One modality of the world.

    Attributes:
        name: ``"image" | "video" | "audio"``.
        attrs: ordered attribute names and their values, e.g. ``(("size", SIZES), ("colour", ...), ...)``.
        shape: tensor shape ``(C, H, W)`` of one item as the encoders/decoders see it (video: frames x RGB stacked).
        noun: the caption's head noun ("" for images whose shape is the noun).
        tag: the short tag used for the modality's ``<tag>``/``</tag>`` tokens and ``[TAGi]`` signal tokens.
    """

    name: str
    attrs: tuple[tuple[str, tuple[str, ...]], ...]
    shape: tuple[int, int, int]
    tag: str

    @property
    def attr_names(self) -> tuple[str, ...]:
        return tuple(a for a, _ in self.attrs)

    def combos(self) -> list[dict[str, str]]:
        return [dict(zip(self.attr_names, vals, strict=True)) for vals in itertools.product(*(v for _, v in self.attrs))]

    def caption(self, a: dict[str, str]) -> str:
        if self.name == "image":
            return f"a {a['size']} {a['colour']} {a['shape']}"
        if self.name == "video":
            return f"a {a['colour']} {a['shape']} moving {a['motion']}"
        return f"a {a['pitch']} {a['rhythm']} {a['timbre']} tone"

    def render(self, a: dict[str, str], rng: np.random.Generator | None = None) -> torch.Tensor:
        if self.name == "image":
            return torch.from_numpy(_image(a["shape"], a["colour"], a["size"], 0, 0))
        if self.name == "video":
            return torch.from_numpy(_video(a["shape"], a["colour"], a["motion"]))
        phase = 0.0 if rng is None else float(rng.uniform(0, 2 * math.pi))
        return log_mel(torch.from_numpy(tone(a["pitch"], a["timbre"], a["rhythm"], phase=phase)))


IMAGE = ModalitySpec("image", (("size", SIZES), ("colour", tuple(COLOURS)), ("shape", SHAPES)), (3, SIZE, SIZE), "img")
VIDEO = ModalitySpec("video", (("colour", tuple(COLOURS)), ("shape", SHAPES), ("motion", MOTIONS)),
                     (3 * VIDEO_FRAMES, SIZE, SIZE), "vid")
AUDIO = ModalitySpec("audio", (("pitch", tuple(PITCHES)), ("rhythm", RHYTHMS), ("timbre", TIMBRES)),
                     (1, N_MELS, N_FRAMES_AUDIO), "aud")
SPECS = {"image": IMAGE, "video": VIDEO, "audio": AUDIO}


def spec(name: str) -> ModalitySpec:
    if name not in SPECS:
        raise ValueError(f"next_gpt: unsupported modality {name!r}; supported: {sorted(SPECS)}")
    return SPECS[name]


# ------------------------------------------------------------------------------------------------ renderers
def _mask(shape: str, half: float, cx: float, cy: float) -> np.ndarray:
    yy, xx = np.mgrid[0:SIZE, 0:SIZE] + 0.5
    dx, dy = xx - cx, yy - cy
    if shape == "circle":
        return (dx ** 2 + dy ** 2 <= half ** 2).astype(np.float32)
    if shape == "square":
        return ((abs(dx) <= half * 0.85) & (abs(dy) <= half * 0.85)).astype(np.float32)
    if shape == "triangle":
        return ((dy <= half) & (dy >= -half) & (abs(dx) <= (dy + half) / 2)).astype(np.float32)
    w = max(1.0, half / 2.5)
    return (((abs(dx) <= w) & (abs(dy) <= half)) | ((abs(dy) <= w) & (abs(dx) <= half))).astype(np.float32)


def _image(shape: str, colour: str, size: str, ox: float, oy: float, half: float | None = None) -> np.ndarray:
    half = half if half is not None else (3.5 if size == "small" else 6.5)
    m = _mask(shape, half, SIZE / 2 + ox, SIZE / 2 + oy)
    rgb = np.asarray(COLOURS[colour], np.float32)[:, None, None]
    return (m[None] * rgb * 2.0 - 1.0).astype(np.float32)  # in [-1, 1], background -1


def _video(shape: str, colour: str, motion: str) -> np.ndarray:
    step = {"left": (-2, 0), "right": (2, 0), "up": (0, -2), "down": (0, 2)}[motion]
    frames = [_image(shape, colour, "small", (t - 1.5) * step[0], (t - 1.5) * step[1], half=4.0)
              for t in range(VIDEO_FRAMES)]
    return np.concatenate(frames, 0)


def tone(pitch: str, timbre: str, rhythm: str, *, phase: float = 0.0) -> np.ndarray:
    """0.5 s at 8 kHz: a tone of the given pitch/timbre, steady or pulsing at 4 Hz (float32 in [-1, 1])."""
    t = np.arange(int(SAMPLE_RATE * AUDIO_SECONDS)) / SAMPLE_RATE
    ph = 2 * np.pi * PITCHES[pitch] * t + phase
    if timbre == "sine":
        x = np.sin(ph)
    elif timbre == "square":
        x = np.sign(np.sin(ph))
    else:
        x = 2 * ((ph / (2 * np.pi)) % 1.0) - 1
    if rhythm == "pulsing":
        x = x * (np.sin(2 * np.pi * 4 * t) > 0)
    return (0.5 * x).astype(np.float32)


def _mel_filterbank() -> torch.Tensor:
    n_fft = 256
    freqs = torch.linspace(0, SAMPLE_RATE / 2, n_fft // 2 + 1)
    mel = lambda f: 2595 * math.log10(1 + f / 700)  # noqa: E731
    pts = torch.linspace(mel(100.0), mel(3800.0), N_MELS + 2)
    hz = 700 * (10 ** (pts / 2595) - 1)
    fb = torch.zeros(N_MELS, n_fft // 2 + 1)
    for i in range(N_MELS):
        lo, c, hi = hz[i], hz[i + 1], hz[i + 2]
        fb[i] = torch.clamp(torch.minimum((freqs - lo) / (c - lo), (hi - freqs) / (hi - c)), min=0)
    return fb


_FB = _mel_filterbank()
_HOP = 250


def log_mel(wave: torch.Tensor) -> torch.Tensor:
    """Waveform (n,) at 8 kHz -> log-mel (1, 16, 16) scaled to about [-1, 1]."""
    spec_ = torch.stft(wave, n_fft=256, hop_length=_HOP, window=torch.hann_window(256), return_complex=True)
    mag = spec_.abs()[:, :N_FRAMES_AUDIO] ** 2
    lm = torch.log10(_FB @ mag + 1e-4)
    return ((lm + 2.0) / 2.0).clamp(-1.0, 1.5)[None].float()


def mel_to_wave(lm: torch.Tensor, *, iters: int = 24) -> np.ndarray:
    """Approximate inverse of :func:`log_mel` (pseudo-inverse filterbank + Griffin-Lim), for listening only."""
    power = (10 ** (lm[0].double() * 2.0 - 2.0) - 1e-4).clamp(min=0)
    mag = (torch.linalg.pinv(_FB.double()) @ power).clamp(min=0).sqrt().float()
    n = int(SAMPLE_RATE * AUDIO_SECONDS)
    win = torch.hann_window(256)
    full = torch.zeros(129, n // _HOP + 1)
    full[:, :mag.shape[1]] = mag
    angle = torch.exp(2j * math.pi * torch.rand(full.shape, generator=torch.Generator().manual_seed(0)))
    x = torch.zeros(n)
    for _ in range(iters):
        x = torch.istft(full * angle, n_fft=256, hop_length=_HOP, window=win, length=n)
        s = torch.stft(x, n_fft=256, hop_length=_HOP, window=win, return_complex=True)
        angle = torch.exp(1j * torch.angle(s))
    x = x / (x.abs().max() + 1e-8) * 0.5
    return x.numpy().astype(np.float32)


_BANK: dict[str, tuple[list[str], torch.Tensor]] = {}
_VARIANTS = 4  # renders per attribute combination (audio: random phases; image/video are deterministic)


def _bank(spec_: ModalitySpec) -> tuple[list[str], torch.Tensor]:
    if spec_.name not in _BANK:
        rng = np.random.default_rng(12345)
        combos = spec_.combos()
        x = torch.stack([torch.stack([spec_.render(a, rng) for _ in range(_VARIANTS)]) for a in combos])
        _BANK[spec_.name] = ([spec_.caption(a) for a in combos], x)
    return _BANK[spec_.name]


def sample_items(spec_: ModalitySpec, n: int, rng: np.random.Generator,
                 combos: list[dict[str, str]] | None = None) -> tuple[torch.Tensor, list[dict[str, str]]]:
    """``n`` random items (tensor (n, C, H, W)) and their attributes, drawn from ``combos`` (default: all)."""
    combos = combos if combos is not None else spec_.combos()
    picks = [combos[i] for i in rng.integers(0, len(combos), size=n)]
    return render_many(spec_, picks, rng), picks


def render_many(spec_: ModalitySpec, attrs: list[dict[str, str]], rng: np.random.Generator) -> torch.Tensor:
    """Renders of ``attrs`` (n, C, H, W) from a cached bank of renders per attribute combination."""
    caps, x = _bank(spec_)
    index = {c: i for i, c in enumerate(caps)}
    rows = torch.tensor([index[spec_.caption(a)] for a in attrs])
    var = torch.from_numpy(rng.integers(0, _VARIANTS, len(attrs)))
    return x[rows, var]


# ------------------------------------------------------------------------------------------------ text
HUMAN, ASSISTANT, SEP = "human:", "assistant:", "###"
GEN_VERBS = {"image": ("show me", "draw"), "video": ("make a video of", "animate"),
             "audio": ("play", "let me hear")}
ANSWERS = {"image": "here is the picture", "video": "here is the video", "audio": "here is the sound"}
QUESTION = {"image": ("colour", "what colour is it ?"), "video": ("motion", "where is it moving ?"),
            "audio": ("pitch", "how high is it ?")}
CHAT = [("hello", "hello how can i help"), ("thank you", "you are welcome"), ("who are you", "i am a helpful model")]


def facts() -> list[str]:
    out = []
    for table, what in ((COLOUR_THINGS, "colour"), (SIZE_THINGS, "size"), (PITCH_THINGS, "pitch"),
                        (MOTION_THINGS, "direction")):
        for v, things in table.items():
            out += [f"the {what} of {t} is {v}" for t in things]
    return out


def implicit_caption_request(spec_: ModalitySpec, a: dict[str, str], rng: np.random.Generator) -> str:
    """A generation request whose attributes are stated indirectly, e.g. "show me a circle with the colour of
    grass and the size of a mouse"."""
    verb = GEN_VERBS[spec_.name][int(rng.integers(2))]
    pick = lambda tab, k: tab[a[k]][int(rng.integers(len(tab[a[k]])))]  # noqa: E731
    if spec_.name == "image":
        return (f"{verb} a {a['shape']} with the colour of {pick(COLOUR_THINGS, 'colour')} and the size of "
                f"{pick(SIZE_THINGS, 'size')}")
    if spec_.name == "video":
        return (f"{verb} a {a['shape']} with the colour of {pick(COLOUR_THINGS, 'colour')} moving in the "
                f"direction of {pick(MOTION_THINGS, 'motion')}")
    return f"{verb} a {a['rhythm']} {a['timbre']} tone with the pitch of {pick(PITCH_THINGS, 'pitch')}"


def lm_corpus(specs: list[ModalitySpec], rng: np.random.Generator, n: int) -> list[str]:
    """Text-only pretraining corpus of the tiny LLM: captions, facts, chit-chat and text dialogues in the
    ``### human: ... ### assistant: ... ###`` format (no media, no signal tokens)."""
    fs = facts()
    out = []
    for _ in range(n):
        r = rng.random()
        s = specs[int(rng.integers(len(specs)))]
        a = s.combos()[int(rng.integers(len(s.combos())))]
        if r < 0.3:
            out.append(f"{fs[int(rng.integers(len(fs)))]} . {fs[int(rng.integers(len(fs)))]} .")
        elif r < 0.5:
            q, ans = CHAT[int(rng.integers(len(CHAT)))]
            out.append(f"{SEP} {HUMAN} {q} {SEP} {ASSISTANT} {ans} {SEP}")
        elif r < 0.75:
            out.append(f"{SEP} {HUMAN} describe {s.caption(a)} {SEP} {ASSISTANT} {s.caption(a)} {SEP}")
        else:
            out.append(f"{SEP} {HUMAN} {implicit_caption_request(s, a, rng)} {SEP} {ASSISTANT} {s.caption(a)} {SEP}")
    return out


@dataclass
class Turn:
    """One dialogue turn: the human's text and optional input media; the assistant's text and optional output.

    ``out_modality`` is ``None`` for a text-only answer; ``out_attrs``/``out_caption`` describe the gold media.
    """

    human: str
    in_modality: str | None = None
    in_attrs: dict[str, str] | None = None
    answer: str = ""
    out_modality: str | None = None
    out_attrs: dict[str, str] | None = None
    out_caption: str | None = None
    implicit: bool = False
    in_data: torch.Tensor | None = None  # the input media itself (else rendered from ``in_attrs``)


def make_turn(kind: str, s: ModalitySpec, a: dict[str, str], rng: np.random.Generator,
              prev: Turn | None = None) -> Turn:
    """One turn of a given kind: ``explicit`` / ``implicit`` generation, ``edit`` (change one attribute of the
    previous turn's output: an attribute stated across turns), ``ask`` (X -> T question about input media),
    ``caption`` (X -> T captioning) or ``chat``."""
    if kind == "explicit":
        verb = GEN_VERBS[s.name][int(rng.integers(2))]
        return Turn(f"{verb} {s.caption(a)}", answer=ANSWERS[s.name], out_modality=s.name, out_attrs=a,
                    out_caption=s.caption(a))
    if kind == "implicit":
        return Turn(implicit_caption_request(s, a, rng), answer=ANSWERS[s.name], out_modality=s.name,
                    out_attrs=a, out_caption=s.caption(a), implicit=True)
    if kind == "edit":
        assert prev is not None and prev.out_modality == s.name and prev.out_attrs is not None
        name, values = s.attrs[int(rng.integers(len(s.attrs)))]
        new = dict(prev.out_attrs)
        new[name] = [v for v in values if v != new[name]][int(rng.integers(len(values) - 1))]
        return Turn(f"now make it {new[name]}", answer=ANSWERS[s.name], out_modality=s.name, out_attrs=new,
                    out_caption=s.caption(new), implicit=True)
    if kind == "ask":
        k, q = QUESTION[s.name]
        return Turn(q, in_modality=s.name, in_attrs=a, answer=f"it is {a[k]}")
    if kind == "caption":
        return Turn("describe this", in_modality=s.name, in_attrs=a, answer=s.caption(a))
    q, ans = CHAT[int(rng.integers(len(CHAT)))]
    return Turn(q, answer=ans)


def mosit_dialogue(specs: list[ModalitySpec], rng: np.random.Generator, *, turns: tuple[int, int] = (2, 4),
                   combos: dict[str, list[dict[str, str]]] | None = None) -> list[Turn]:
    """A multi-turn modality-switching dialogue: each turn picks a modality and a kind at random; ``edit`` turns
    refer to the previous output (attributes across turns)."""
    out: list[Turn] = []
    for _ in range(int(rng.integers(turns[0], turns[1] + 1))):
        s = specs[int(rng.integers(len(specs)))]
        cs = (combos or {}).get(s.name) or s.combos()
        a = cs[int(rng.integers(len(cs)))]
        prev = out[-1] if out else None
        kinds = ["explicit", "implicit", "ask", "caption", "chat"]
        if prev is not None and prev.out_modality is not None:
            kinds += ["edit", "edit"]
        kind = kinds[int(rng.integers(len(kinds)))]
        if kind == "edit":
            s = SPECS[prev.out_modality]  # type: ignore[union-attr]
        out.append(make_turn(kind, s, a, rng, prev))
    return out


def vocabulary(specs: list[ModalitySpec] | None = None) -> list[str]:
    """Every word the world's text uses (the tiny LLM's and the decoders' word-level vocabulary)."""
    specs = specs or list(SPECS.values())
    words: set[str] = {HUMAN, ASSISTANT, SEP, ".", "?", "describe", "this", "it", "is", "now", "make", "with",
                       "the", "of", "and", "in", "direction", "moving", "tone", "a", "an", "pitch", "colour", "size"}
    rng = np.random.default_rng(0)
    for text in facts():
        words |= set(text.split())
    for q, a in CHAT:
        words |= set(q.split()) | set(a.split())
    for s in SPECS.values():
        for _, vals in s.attrs:
            words |= set(vals)
        for v in GEN_VERBS[s.name]:
            words |= set(v.split())
        words |= set(ANSWERS[s.name].split()) | set(QUESTION[s.name][1].split())
        for a in s.combos():
            words |= set(s.caption(a).split()) | set(implicit_caption_request(s, a, rng).split())
    return sorted(words)
