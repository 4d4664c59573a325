"""Sample utterances in the style Orpheus is used for (inline tags included): a call centre's short
turns and long-form reading. The benchmarks load servers with them; the engine build calibrates FP8 on them."""

TEXT_SETS = {
    "conversational": [
        "Hi, thanks for calling. How can I help you today?",
        "Sure, I can book that for you.",
        "Your order shipped this morning and should arrive on Thursday.",
        "Could you repeat the last four digits of your card, please?",
        "Great, you're all set. Is there anything else I can do for you?",
        "I'm sorry about the wait <sigh> we're a little busy right now.",
        "Let me check that for you, one moment.",
        "Yes, we're open until eight tonight.",
    ],
    "longform": [
        "The history of the lighthouse goes back more than two thousand years. The first ones were simple fires "
        "burning on hilltops, tended through the night so that ships could find their way home. Later, towers of "
        "stone carried the light higher, and mirrors and lenses sent it farther out to sea.",
        "Every morning the market wakes before the town does. Farmers arrive in the dark with crates of apples and "
        "bunches of herbs, bakers stack loaves still warm from the oven, and by the time the sun is up the square is "
        "full of voices, bargaining and laughing and calling out the prices of the day.",
        "When you start a new habit, make it small enough that you cannot fail. Read one page, walk for five "
        "minutes, write a single sentence. The point is not the size of the step but the fact that you take it "
        "every day, until it becomes part of who you are.",
    ],
}


def without_tags(text: str) -> str:
    """``text`` without Orpheus's inline emotion tags (for a family that would read them aloud)."""
    import re

    return " ".join(re.sub(r"<[a-z]+>", " ", text).split())
