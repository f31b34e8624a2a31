"""Seeded grammar for the demo model's synthetic corpus: stories, questions and chats.

Everything here is generated from a `random.Random`, so one seed always gives one corpus.
A sample is either a plain string (a story or a question/answer pair) or a chat: a list
of {"role", "content"} messages that the tokenizer's chat template renders.
"""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class Hero:
    noun: str  # "cat", "girl"
    name: str  # "" for animals, "Lily" for children
    he: str
    likes: tuple[str, ...]  # activities, base form
    places: tuple[str, ...]
    food: str

    @property
    def keys(self) -> tuple[str, ...]:  # how a prompt names the hero: "a cat", "Lily"
        if self.name:
            return self.name, f"a {self.noun} named {self.name}", f"a little {self.noun}"
        return f"a {self.noun}", f"a little {self.noun}"

    @property
    def ref(self) -> str:  # later mentions in a story: "the cat", "Lily"
        return self.name or f"the {self.noun}"

    def intro(self, adj: str = "little") -> str:  # first mention: "a little girl named Lily"
        return f"a {adj} {self.noun}".replace("  ", " ") + (
            f" named {self.name}" if self.name else "")

    @property
    def him(self) -> str:
        return "him" if self.he == "he" else "her"

    @property
    def his(self) -> str:
        return "his" if self.he == "he" else "her"


def _animal(noun, he, likes, places, food):
    return Hero(noun, "", he, likes, places, food)


def _child(name, kind, likes, places, food):
    return Hero(kind, name, "she" if kind == "girl" else "he", likes, places, food)


HEROES = (
    _animal("cat", "she", ("chase butterflies", "sleep in the sun", "play with a ball of yarn"),
            ("garden", "kitchen"), "fish"),
    _animal("dog", "he", ("run in the park", "dig in the sand", "play with a stick"),
            ("park", "yard"), "bone"),
    _animal("bird", "she", ("sing songs", "fly over the trees", "build a nest"),
            ("tree", "forest"), "seeds"),
    _animal("rabbit", "he", ("hop in the grass", "eat carrots", "dig holes"),
            ("field", "garden"), "carrots"),
    _animal("frog", "he", ("jump in the pond", "catch flies", "swim"), ("pond", "river"), "flies"),
    _animal("bear", "he", ("climb trees", "eat honey", "take long naps"),
            ("forest", "cave"), "honey"),
    _animal("duck", "she", ("swim in the pond", "splash in the water", "walk by the lake"),
            ("pond", "lake"), "bread"),
    _animal("mouse", "she", ("look for cheese", "run fast", "hide in small places"),
            ("house", "kitchen"), "cheese"),
    _child("Lily", "girl", ("pick flowers", "play with her doll", "draw pictures"),
           ("park", "garden"), "apples"),
    _child("Tom", "boy", ("play with his ball", "fly his kite", "build castles in the sand"),
           ("park", "beach"), "cookies"),
    _child("Mia", "girl", ("dance", "read books", "paint pictures"), ("school", "garden"),
           "cake"),
    _child("Ben", "boy", ("ride his bike", "play with his toy car", "climb trees"),
           ("park", "yard"), "pizza"),
)

ANIMAL_FACTS = {  # animal: (sound, legs, home, can fly)
    "cat": ("meow", "four", "a house", False), "dog": ("woof", "four", "a house", False),
    "bird": ("tweet", "two", "a nest", True), "rabbit": ("squeak", "four", "a hole", False),
    "frog": ("ribbit", "four", "a pond", False), "bear": ("growl", "four", "a cave", False),
    "duck": ("quack", "two", "a pond", True), "mouse": ("squeak", "four", "a hole", False),
    "cow": ("moo", "four", "a farm", False), "sheep": ("baa", "four", "a farm", False),
}
COLORS = {"sky": "blue", "grass": "green", "sun": "yellow", "snow": "white", "apple": "red",
          "banana": "yellow", "carrot": "orange", "night": "dark", "sea": "blue", "leaf": "green"}
OPPOSITES = {"big": "small", "hot": "cold", "happy": "sad", "up": "down", "day": "night",
             "fast": "slow", "old": "new", "open": "closed", "wet": "dry", "tall": "short"}
ITEMS = ("ball", "hat", "kite", "toy", "box", "key", "book", "shoe")
ITEM_COLORS = ("red", "blue", "green", "yellow", "little", "shiny")
HIDES = ("under a big tree", "behind a rock", "under a bush", "next to the river", "in the grass")
SHELTERS = ("under a big tree", "into a small cave", "under a bush", "into the house")
WEATHER = ("The sun was warm.", "The sky was blue.", "It was a sunny day.", "The wind was soft.")
ADJS = ("happy", "curious", "kind", "brave", "playful", "small")
SMALL_TALK = (
    (("Hello!", "Hi!", "Hi there!", "Hello."), "Hello! How can I help you today?"),
    (("How are you?", "How are you today?"), "I am fine, thank you! How can I help you?"),
    (("What is your name?", "Who are you?"), "I am Mini, a small demo model. I like to tell stories."),
    (("Thank you!", "Thanks!", "Thank you very much."), "You are welcome!"),
    (("Goodbye!", "Bye!"), "Goodbye! Have a nice day!"),
)
SYSTEMS = ("You are a helpful assistant.", "You are a friendly assistant who tells short stories.")
STORY_ASKS = ("Tell me a story about {}.", "Can you tell me a story about {}?",
              "Please write a short story about {}.", "I want a story about {}.",
              "Write a story about {}.")


def _cap(text: str) -> str:
    return text[:1].upper() + text[1:]


def story(rng: random.Random, hero: Hero) -> str:
    """One short story that keeps returning to `hero`."""
    friend = rng.choice([h for h in HEROES if h is not hero])
    h, f = hero, friend
    H, He, His = _cap(h.ref), _cap(h.he), _cap(h.his)
    place, like = rng.choice(h.places), rng.choice(h.likes)
    out = [rng.choice((
        f"Once upon a time, there was {h.intro()}.",
        f"Once upon a time, there was {h.intro(rng.choice(('', *ADJS)))}.",
        f"Once upon a time, in a big {rng.choice(('town', 'forest', 'village'))}, "
        f"there lived {h.intro()}.",
    ))]
    out.append(rng.choice((f"{H} loved to {like}.", f"Every day, {h.he} liked to {like}.",
                           f"{H} was very {rng.choice(ADJS)} and loved to {like}.")))
    out.append(f"One day, {h.ref} went to the {place}.")
    plot = rng.randrange(4)  # 2 is the rainy one, so no sunny weather before it
    if plot != 2 and rng.random() < 0.4:
        out.append(rng.choice(WEATHER))
    out.append(f"There, {h.he} saw {f.intro()}.")
    if plot == 0:
        item = f"{rng.choice(ITEM_COLORS)} {rng.choice(ITEMS)}"
        out += [f"{_cap(f.ref)} was sad because {f.he} lost {f.his} {item}.",
                f"\"Do not be sad. I will help you,\" said {h.ref}.",
                f"{H} looked everywhere. At last, {h.he} found the {item} {rng.choice(HIDES)}.",
                f"\"Thank you!\" said {f.ref}. {_cap(f.he)} was very happy."]
    elif plot == 1:
        out += [f"\"Do you want to play with me?\" asked {h.ref}.",
                f"\"Yes!\" said {f.ref}. They played together all day.",
                f"{H} showed {f.ref} how to {like}. It was a lot of fun."]
    elif plot == 2:
        out += [f"{H} said hello, but then it started to rain.",
                f"{H} and {f.ref} ran {rng.choice(SHELTERS)} to stay dry.",
                f"When the rain stopped, {h.ref} saw a big rainbow in the sky."]
    else:
        out += [f"{H} was hungry, so {h.he} shared {h.his} {h.food} with {f.ref}.",
                f"\"This is yummy!\" said {f.ref}. {H} smiled."]
    out.append(rng.choice((
        f"From that day on, {h.ref} and {f.ref} were best friends.",
        f"At night, {h.ref} went home and slept. {He} had a very good day.",
        f"{H} went home happy. {His} mom gave {h.him} a big hug.",
    )))
    return " ".join(out)


def question(rng: random.Random) -> tuple[str, str]:
    """One (question, answer) pair from a small fact table."""
    kind = rng.randrange(6)
    animal = rng.choice(sorted(ANIMAL_FACTS))
    sound, legs, home, flies = ANIMAL_FACTS[animal]
    if kind == 0:
        return f"What does a {animal} say?", f"A {animal} says {sound}."
    if kind == 1:
        return f"How many legs does a {animal} have?", f"A {animal} has {legs} legs."
    if kind == 2:
        return f"Where does a {animal} live?", f"A {animal} lives in {home}."
    if kind == 3:
        can = "Yes, a {} can fly." if flies else "No, a {} cannot fly."
        return f"Can a {animal} fly?", can.format(animal)
    if kind == 4:
        thing = rng.choice(sorted(COLORS))
        return f"What color is the {thing}?", f"The {thing} is {COLORS[thing]}."
    word = rng.choice(sorted(OPPOSITES))
    return f"What is the opposite of {word}?", f"The opposite of {word} is {OPPOSITES[word]}."


def _turn(rng: random.Random) -> tuple[str, str]:
    kind = rng.random()
    if kind < 0.6:
        hero = rng.choice(HEROES)
        key = rng.choice(hero.keys)
        ask = rng.choice(STORY_ASKS).format(key)
        lead = rng.choice(("", "", f"Here is a story about {key}. "))
        return ask, lead + story(rng, hero)
    if kind < 0.85:
        return question(rng)
    asks, answer = rng.choice(SMALL_TALK)
    return rng.choice(asks), answer


def chat(rng: random.Random) -> list[dict[str, str]]:
    messages = []
    if rng.random() < 0.3:
        messages.append({"role": "system", "content": rng.choice(SYSTEMS)})
    for _ in range(1 if rng.random() < 0.8 else 2):
        user, assistant = _turn(rng)
        messages += [{"role": "user", "content": user},
                     {"role": "assistant", "content": assistant}]
    return messages


def corpus(seed: int, n: int) -> list[str | list[dict[str, str]]]:
    """`n` samples: about 55% plain stories, 10% plain Q/A, 35% chats."""
    rng = random.Random(seed)
    samples: list[str | list[dict[str, str]]] = []
    for _ in range(n):
        kind = rng.random()
        if kind < 0.55:
            samples.append(story(rng, rng.choice(HEROES)))
        elif kind < 0.65:
            samples.append("Question: {}\nAnswer: {}".format(*question(rng)))
        else:
            samples.append(chat(rng))
    return samples
