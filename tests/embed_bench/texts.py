"""The bench's texts: N messages of realistic lengths (SMS and chat between shift workers and
their agent), deterministic for a seed, one per line (newlines inside a message as a literal \\n).

    python texts.py 2000 > texts.txt
"""
import random
import sys

OPENERS = ["hi", "hey", "morning", "quick one", "sorry to bother you", "hello again", "ok so", ""]
ASKS = [
    "when is my next shift",
    "can I swap my saturday shift with Priya",
    "what time do I start tomorrow",
    "am I on the roster for the long weekend",
    "how many hours have I done this fortnight",
    "who do I call if a participant falls",
    "is the incident form the blue one or the online one",
    "can you remind me of the policy on overtime",
    "I need to take leave next week for a medical appointment",
    "the printer at the Fairfield site is broken again",
    "my login to the rostering app stopped working",
    "Reggie wants to go to the footy on sunday, is that ok with his plan",
    "what's the address for the new house in Parramatta",
    "do I need a first aid refresher this year",
    "thanks that helps",
    "running 10 minutes late, traffic on the M4",
    "can you send me the handover notes from last night",
    "who is the on-call manager tonight",
    "I think I was underpaid for the public holiday",
    "the medication chart for room 3 is missing a signature",
]
DETAILS = [
    "I already asked my team leader but haven't heard back.",
    "It's the third time this month so I'd like it written down somewhere.",
    "No rush, whenever you get a chance.",
    "My kids have school pickup at 3 so I can't do afternoons on Wednesdays.",
    "The participant was calm afterwards and ate dinner, but I want it on record.",
    "Last time the app said I was rostered but the site had someone else.",
    "I can cover the morning if someone else takes the sleepover.",
    "Please let the coordinator know as well.",
    "I've attached a photo of the form in the group chat.",
    "Is there anyone I should copy in on this?",
    "He was a bit agitated before lunch and asked for his sister twice.",
    "We ran out of gloves and hand sanitiser at the Blacktown house.",
    "The car's fuel card was declined at the servo this morning.",
    "I finished the online module but it still shows as incomplete.",
]


def message(rng: random.Random) -> str:
    kind = rng.random()
    opener = rng.choice(OPENERS)
    ask = rng.choice(ASKS)
    if kind < 0.45:  # a short SMS: a few words
        words = ask.split()
        text = " ".join(words[: rng.randint(3, len(words))])
    elif kind < 0.85:  # a chat line with a detail or two
        text = f"{opener} {ask}? " + " ".join(rng.sample(DETAILS, rng.randint(1, 2)))
    else:  # a long message (an incident, a complaint): up to ~150 words
        parts = [f"{opener}, {ask}."] + rng.sample(DETAILS, rng.randint(4, 8))
        text = " ".join(parts) + " " + " ".join(rng.sample(DETAILS, rng.randint(2, 5)))
    return text.strip().replace("\n", "\\n")


def texts(n: int, seed: int = 22) -> list[str]:
    rng = random.Random(seed)
    return [message(rng) for _ in range(n)]


if __name__ == "__main__":
    for line in texts(int(sys.argv[1]) if len(sys.argv) > 1 else 2000):
        print(line)
