"""The closed vocabulary of SynthScenes: shapes, colours, textures, relations and their words.

Everything else in the world (sampler, renderer, captions, judge) reads its names from here, so a new
shape or colour is one edit. Object colours are saturated and far apart in hue; backgrounds use the same
names at low saturation, so that the judge can tell an object pixel from a background pixel by
saturation alone and still read the background's hue.
"""

SHAPES = ("circle", "square", "triangle", "ring", "cross")
SHAPE_PLURALS = {"circle": "circles", "square": "squares", "triangle": "triangles", "ring": "rings",
                 "cross": "crosses"}

# Saturated object colours (RGB in 0..255); their hues are 30 degrees or more apart.
COLOURS = {
    "red": (222, 40, 40),
    "orange": (245, 125, 15),
    "yellow": (240, 225, 30),
    "green": (40, 172, 62),
    "cyan": (28, 188, 212),
    "blue": (44, 82, 222),
    "purple": (150, 58, 204),
}
# Backgrounds take the same hues at this saturation, plus a neutral grey.
BACKGROUND_COLOURS = (*COLOURS, "gray")
BACKGROUND_SATURATION = 0.3

# Object textures: stripes and dots are drawn in a darker shade of the object's own colour (same hue and
# saturation), so texture makes next-token distributions ambiguous without confusing colour.
OBJECT_TEXTURES = ("solid", "striped", "dotted")
TEXTURE_SHADE = 0.55
# Background textures and the adjective each has in captions.
BACKGROUND_TEXTURES = {"mottled": "noise", "striped": "stripes", "fading": "gradient",
                       "photographic": "photo"}

RELATIONS = ("above", "below", "left of", "right of")
RELATION_PHRASES = {"above": "above", "below": "below", "left of": "to the left of",
                    "right of": "to the right of"}

COUNT_WORDS = {1: "one", 2: "two", 3: "three", 4: "four"}
MAX_OBJECTS = 4

# GenEval's six task categories; a caption's category follows from its structure (see Prompt.category).
CATEGORIES = ("single_object", "two_object", "counting", "colors", "position", "color_attr")

# Layout: objects sit in distinct cells of a 3x3 grid, with jitter that keeps each inside its cell
# (so no two objects touch and counting stays well defined at every resolution).
GRID = 3
RADIUS_RANGE = (0.075, 0.13)  # object half-size as a fraction of the image side
CELL_MARGIN = 0.02
MAX_RADIUS = 0.5 / GRID - CELL_MARGIN  # the largest half-size that keeps an object inside its cell
