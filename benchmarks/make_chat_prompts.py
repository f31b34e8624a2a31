"""Write benchmarks/data/chat_prompts.jsonl: a hand-built set of English chat prompts for the
lab on a real instruct model (`--workload custom:benchmarks/data/chat_prompts.jsonl`).

There is no ShareGPT here (no network), so the prompts are composed from task types x topics
written by hand below. The task types are chosen for the spread of answer lengths an instruct
model gives them: yes/no and one-word answers, short facts, arithmetic, one-sentence
definitions, lists, explanations, and long stories, essays, letters and code. The file is
vLLM's "custom" dataset format: one JSON object per line with a "prompt" field.

    python benchmarks/make_chat_prompts.py [--output PATH]

The output is deterministic (the composition is seeded); rerunning it rewrites the same file.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

OUT = Path(__file__).parent / "data" / "chat_prompts.jsonl"

COUNTRIES = ["France", "Japan", "Brazil", "Canada", "Egypt", "Italy", "Kenya", "Mexico",
             "Norway", "India", "Spain", "Australia", "Germany", "Peru", "Vietnam", "Poland"]
ANIMALS = ["a whale", "a penguin", "a bat", "a spider", "a shark", "a frog", "an eagle",
           "a dolphin", "a snake", "an octopus", "a tomato", "a crocodile"]
CLASSES = ["mammal", "bird", "fish", "reptile", "insect", "fruit"]
CONCEPTS = ["photosynthesis", "gravity", "inflation", "a black hole", "democracy", "an atom",
            "evolution", "a vaccine", "the internet", "a volcano", "recursion", "a rainbow",
            "compound interest", "climate change", "DNA", "an earthquake", "a neural network",
            "the water cycle", "supply and demand", "electricity"]
THINGS = ["fruits", "programming languages", "planets", "musical instruments", "European "
          "capitals", "kitchen tools", "sports played with a ball", "colors", "ways to save "
          "money", "tips for better sleep", "healthy breakfasts", "board games", "famous "
          "painters", "things to pack for a beach trip", "reasons to learn a language"]
CHARACTERS = ["a lonely robot", "a brave little mouse", "a pirate who is afraid of water",
              "a girl who can talk to trees", "an old lighthouse keeper", "a dragon who loves "
              "books", "two friends lost in a forest", "a cat who wants to fly", "a young "
              "wizard", "a detective in a small town", "a time traveler", "a baker in Paris"]
ESSAYS = ["the importance of education", "social media and teenagers", "why people should "
          "read more books", "the future of electric cars", "working from home", "protecting "
          "the oceans", "the role of art in society", "space exploration", "city life versus "
          "country life", "the benefits of sport"]
CODE = ["reverses a string", "checks whether a number is prime", "computes the Fibonacci "
        "numbers", "sorts a list with merge sort", "counts the words in a text file",
        "finds the largest element of a list", "converts Celsius to Fahrenheit", "implements "
        "a stack class", "reads a CSV file and prints the average of a column", "implements "
        "binary search"]
WORDS = ["happy", "big", "fast", "cold", "difficult", "beautiful", "quiet", "old", "smart",
         "angry"]
PHRASES = ["good morning", "thank you very much", "where is the train station", "I love you",
           "see you tomorrow", "how much does this cost"]
LANGUAGES = ["French", "Spanish", "German", "Italian"]
JOBS = ["nurse", "firefighter", "farmer", "software engineer", "teacher", "astronaut",
        "chef", "pilot"]
PAIRS = [("a virus", "a bacterium"), ("weather", "climate"), ("a lake", "a sea"),
         ("speed", "velocity"), ("a crocodile", "an alligator"), ("RAM", "a hard disk"),
         ("a republic", "a monarchy"), ("baking soda", "baking powder")]
PEOPLE = ["Albert Einstein", "Marie Curie", "Leonardo da Vinci", "William Shakespeare",
          "Isaac Newton", "Cleopatra", "Mozart", "Nelson Mandela"]


def compose(rng: random.Random) -> list[str]:
    """Every task type over (a sample of) its topics; the types' shares keep the answer
    lengths spread from one word to several hundred tokens."""
    p: list[str] = []
    # One word / yes-no.
    p += [f"Is {a} a {c}? Answer yes or no." for a in ANIMALS for c in rng.sample(CLASSES, 2)]
    p += [f"What is the capital of {c}? Answer with one word." for c in COUNTRIES]
    p += [f"Give one word that means the opposite of '{w}'." for w in WORDS]
    p += [f"What is {rng.randint(2, 50)} plus {rng.randint(2, 50)}? Reply with the number "
          "only." for _ in range(12)]
    # Short facts.
    p += [f"What is the capital of {c}?" for c in COUNTRIES[:10]]
    p += [f"Which continent is {c} in?" for c in COUNTRIES[6:]]
    p += [f"Who was {x}?" for x in PEOPLE]
    p += [f"How do you say '{x}' in {rng.choice(LANGUAGES)}?" for x in PHRASES]
    p += [f"What is {rng.randint(3, 19)} times {rng.randint(3, 19)}?" for _ in range(8)]
    # One sentence.
    p += [f"In one sentence, what is {c}?" for c in CONCEPTS]
    p += [f"Give me a synonym for '{w}' and use it in a sentence." for w in WORDS[:6]]
    # Lists.
    p += [f"List {rng.choice(['three', 'five', 'ten'])} {t}." for t in THINGS]
    p += [f"Name three famous people from {c}." for c in COUNTRIES[:8]]
    # Explanations.
    p += [f"Explain {c} to a ten-year-old." for c in CONCEPTS]
    p += [f"Explain in detail how {c} works." for c in CONCEPTS[:12]]
    p += [f"What is the difference between {a} and {b}?" for a, b in PAIRS]
    p += [f"Describe a typical day in the life of a {j}." for j in JOBS]
    p += [f"Summarize the life of {x} in two sentences." for x in PEOPLE]
    p += [f"What are the pros and cons of {e}?" for e in ESSAYS[:6]]
    p += [f"Tell me about the history and culture of {c}." for c in COUNTRIES[:8]]
    # Long: stories, essays, letters, code.
    p += [f"Write a long story about {c}." for c in CHARACTERS]
    p += [f"Write a short poem about {c}." for c in CHARACTERS[:8]]
    p += [f"Write an essay about {e}." for e in ESSAYS]
    p += [f"Write a detailed essay with an introduction, three arguments and a conclusion "
          f"about {e}." for e in ESSAYS[:6]]
    p += [f"Write a letter to a friend telling them about your trip to {c}." for c in
          COUNTRIES[:8]]
    p += [f"Write a Python function that {c}." for c in CODE]
    p += [f"Write a Python program that {c}, with comments, tests and an example of its "
          "output." for c in CODE[:6]]
    p += [f"Write a step-by-step recipe for a meal from {c}." for c in COUNTRIES[:8]]
    return p


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--output", type=Path, default=OUT)
    args = ap.parse_args()
    prompts = list(dict.fromkeys(compose(random.Random(0))))  # unique, in composition order
    args.output.parent.mkdir(parents=True, exist_ok=True)
    with open(args.output, "w") as f:
        for text in prompts:
            f.write(json.dumps({"prompt": text}) + "\n")
    print(f"{len(prompts)} prompts written to {args.output}")


if __name__ == "__main__":
    main()
