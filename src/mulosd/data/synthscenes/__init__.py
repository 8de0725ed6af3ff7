"""SynthScenes: a seeded, captioned world of textured shapes, rendered vector-exactly at any size, with a
judge that checks captions against images (GenEval's role).

    scene = sample_scene(seed=0, index=7)          # prompt first, then a layout that satisfies it
    image = render(scene, 128)                     # uint8 [128, 128, 3]
    text = caption_text(scene.prompt)              # 'a striped red circle above a ring on a ...'
    verdict = judge(image, parse_caption(text))    # verdict.geneval, verdict.checks
"""

from .caption import CaptionError, caption_text, parse_caption
from .judge import Verdict, judge
from .render import render
from .scene import ObjectSpec, Prompt, Scene, realise, sample_prompt, sample_scene, untaught

__all__ = ["CaptionError", "ObjectSpec", "Prompt", "Scene", "Verdict", "caption_text", "judge", "parse_caption",
           "realise", "render", "sample_prompt", "sample_scene", "untaught"]
