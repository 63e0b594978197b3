"""Dual-track measurement stand-ins (paper Section 3.3, **reconstructed** for the cpu profile): narration of
interaction traces, a Rater that codes narrations into behaviour categories, and a Surveyor that administers
scale items (RSES, need items) to agents through a response model driven by their latent needs.

At the paper profile an LLM narrates, rates and answers (hub.py). Here the narrator fills one of 6 paraphrase
templates per action; the Rater is a bag-of-words logistic regression (torch) trained on narrations built from
only the first ``train_paraphrases`` templates of each action, so the simulation's narrations (all 6 templates)
include wordings it never saw.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from tasks.edumirror import method
from tasks.edumirror.simulation import CATEGORIES, CATEGORY_OF

NAMES = ("Ava", "Ben", "Chloe", "Dev", "Ella", "Finn", "Grace", "Hugo", "Isla", "Jack", "Kira", "Leo", "Maya",
         "Noah", "Olive", "Pablo", "Quinn", "Ruby", "Sam", "Tara", "Umar", "Vera", "Will", "Xena", "Yusuf", "Zoe",
         "Aria", "Bilal", "Cora", "Dan")
SETTINGS = ("during lunch", "in the corridor", "after class", "at break time", "on the playground",
            "in the library", "before the bell", "in the canteen")
# Six paraphrases per action; {a} the actor, {t} the target.
TEMPLATES: dict[str, tuple[str, ...]] = {
    "exclude": ("{a} left {t} out of the group", "{a} would not let {t} sit with them",
                "{a} told the others to ignore {t}", "{a} shut {t} out of the game",
                "{a} turned away when {t} tried to join", "{a} made sure {t} was not invited"),
    "rumour": ("{a} spread a rumour about {t}", "{a} whispered lies about {t}",
               "{a} told everyone a nasty story about {t}", "{a} gossiped behind {t}'s back",
               "{a} posted a mean rumour about {t} online", "{a} made up a story to shame {t}"),
    "confront": ("{a} shoved {t}", "{a} pushed {t} against the wall", "{a} hit {t}",
                 "{a} grabbed {t} and threatened them", "{a} kicked {t}", "{a} tripped {t} on purpose"),
    "help": ("{a} helped {t} with the task", "{a} invited {t} to join the group",
             "{a} shared their notes with {t}", "{a} included {t} in the game",
             "{a} offered to help {t}", "{a} made room for {t} at the table"),
    "comfort": ("{a} comforted {t}", "{a} asked {t} if they were okay", "{a} stood up for {t}",
                "{a} reassured {t} kindly", "{a} sat with {t} when they were upset", "{a} cheered {t} up"),
    "socialise": ("{a} chatted with {t}", "{a} played a game with {t}", "{a} laughed with {t}",
                  "{a} walked home with {t}", "{a} joked around with {t}", "{a} hung out with {t}"),
    "report": ("{a} told the teacher what happened", "{a} reported the problem to the teacher",
               "{a} went to the teacher for help", "{a} informed a teacher", "{a} spoke to the teacher privately",
               "{a} asked the teacher to step in"),
    "withdraw": ("{a} stayed alone", "{a} kept to themselves", "{a} hid in the bathroom",
                 "{a} avoided everyone", "{a} sat quietly in a corner", "{a} stayed away from the others"),
    "study": ("{a} studied", "{a} worked on homework", "{a} read a book", "{a} practised maths",
              "{a} revised for the test", "{a} finished an assignment"),
}
N_PARAPHRASES = 6


def narrate(action: str, actor: int, target: int | None, paraphrase: int, setting: int) -> str:
    """The narration of one event: a paraphrase template with student names and a setting clause."""
    text = TEMPLATES[action][paraphrase].format(a=NAMES[actor % len(NAMES)],
                                                t=NAMES[target % len(NAMES)] if target is not None else "")
    return f"{SETTINGS[setting]}, {text}."


def rater_corpus(size: int, train_paraphrases: int, rng: np.random.Generator) -> tuple[list[str], list[int]]:
    """The Rater's synthetic training corpus: actions uniform, paraphrases 0..train_paraphrases-1 only."""
    actions = list(TEMPLATES)
    texts, labels = [], []
    for _ in range(size):
        action = actions[int(rng.integers(len(actions)))]
        actor, target = (int(x) for x in rng.choice(len(NAMES), size=2, replace=False))
        texts.append(narrate(action, actor, target, int(rng.integers(train_paraphrases)),
                             int(rng.integers(len(SETTINGS)))))
        labels.append(CATEGORY_OF[action])
    return texts, labels


def tokenize(text: str) -> list[str]:
    return [w.strip(".,'!?").lower() for w in text.replace("'s", " s").split() if w.strip(".,'!?")]


def build_vocabulary(texts: Sequence[str]) -> list[str]:
    """Sorted word list of the training corpus; student names are dropped (they carry no behaviour)."""
    names = {n.lower() for n in NAMES}
    return sorted({w for t in texts for w in tokenize(t)} - names)


def bag_of_words(texts: Sequence[str], vocabulary: Sequence[str]) -> torch.Tensor:
    """(texts, vocabulary) word counts; words outside the vocabulary are ignored."""
    index = {w: i for i, w in enumerate(vocabulary)}
    x = torch.zeros(len(texts), len(vocabulary), dtype=torch.float32)
    for row, text in enumerate(texts):
        for word in tokenize(text):
            if word in index:
                x[row, index[word]] += 1.0
    return x


@dataclass
class Rater:
    """Bag-of-words multinomial logistic regression coding a narration into CATEGORIES."""

    vocabulary: list[str]
    weight: torch.Tensor   # (classes, vocabulary)
    bias: torch.Tensor     # (classes,)

    def logits(self, texts: Sequence[str]) -> torch.Tensor:
        return bag_of_words(texts, self.vocabulary) @ self.weight.T + self.bias

    def code(self, texts: Sequence[str]) -> np.ndarray:
        with torch.no_grad():
            return self.logits(texts).argmax(dim=1).numpy()


def train_rater(texts: Sequence[str], labels: Sequence[int], steps: int, lr: float, weight_decay: float,
                seed: int) -> tuple[Rater, list[float]]:
    """Full-batch Adam on the cross-entropy of the bag-of-words logistic regression; returns the loss curve."""
    vocabulary = build_vocabulary(texts)
    x = bag_of_words(texts, vocabulary)
    y = torch.tensor(list(labels), dtype=torch.long)
    generator = torch.Generator().manual_seed(seed)
    weight = (0.01 * torch.randn(len(CATEGORIES), len(vocabulary), generator=generator)).requires_grad_(True)
    bias = torch.zeros(len(CATEGORIES), requires_grad=True)
    optimiser = torch.optim.Adam([weight, bias], lr=lr, weight_decay=weight_decay)
    losses = []
    for _ in range(steps):
        loss = torch.nn.functional.cross_entropy(x @ weight.T + bias, y)
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
        losses.append(float(loss.detach()))
    return Rater(vocabulary, weight.detach(), bias.detach()), losses


# --- the Surveyor ----------------------------------------------------------------------------------------------

NEED_ITEMS_PER_NEED = 3
NEED_ITEM_POINTS = 7
NEED_REVERSE_ITEM = 3  # the third item of each need is negatively worded


def latent_self_esteem(needs: np.ndarray) -> np.ndarray:
    """The latent state RSES measures in the simulator: the mean of esteem and psychological health (0..10)."""
    return (needs[..., 2] + needs[..., 4]) / 2.0


def likert(latent01: np.ndarray, points: int, bias: np.ndarray, noise: np.ndarray) -> np.ndarray:
    """Answer on 1..points to an item whose agreement rises with latent01 in [0, 1]."""
    return np.clip(np.rint(1.0 + (points - 1) * latent01 + bias + noise), 1, points)


def survey(needs: np.ndarray, noise_sd: float, acquiescence_sd: float, rng: np.random.Generator
           ) -> tuple[np.ndarray, np.ndarray]:
    """Administer RSES (10 items, 4-point) and the need items (3 per need, 7-point) to respondents with latent
    ``needs`` (respondents, 5). Each respondent has an agreement bias (acquiescence) that raises every answer,
    so only reverse coding separates it from the trait. Returns raw answers (rses (n, 10), needs (n, 5, 3))."""
    n = needs.shape[0]
    agree = rng.standard_normal(n) * acquiescence_sd
    esteem01 = latent_self_esteem(needs) / 10.0
    rses_latent = np.repeat(esteem01[:, None], 10, axis=1)
    reverse = [i - 1 for i in method.RSES_REVERSE_ITEMS]
    rses_latent[:, reverse] = 1.0 - rses_latent[:, reverse]
    rses = likert(rses_latent, method.RSES_POINTS, agree[:, None], rng.standard_normal((n, 10)) * noise_sd)
    need_latent = np.repeat((needs / 10.0)[:, :, None], NEED_ITEMS_PER_NEED, axis=2)
    need_latent[:, :, NEED_REVERSE_ITEM - 1] = 1.0 - need_latent[:, :, NEED_REVERSE_ITEM - 1]
    need_answers = likert(need_latent, NEED_ITEM_POINTS, agree[:, None, None],
                          rng.standard_normal((n, 5, NEED_ITEMS_PER_NEED)) * noise_sd)
    return rses, need_answers


def need_scale_scores(need_answers: np.ndarray) -> np.ndarray:
    """Need scores on the latent 0..10 scale: mean of the reverse-coded items, mapped from 1..7 to 0..10."""
    coded = method.reverse_code(need_answers, NEED_ITEM_POINTS, (NEED_REVERSE_ITEM,))
    return (coded.mean(axis=-1) - 1.0) / (NEED_ITEM_POINTS - 1) * 10.0
