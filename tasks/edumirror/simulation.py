"""EduMirror's simulation: value-driven student agents, a teacher with a goal, a game master with a clock, and
branching of timelines from a shared checkpoint (paper Section 3; agent internals **reconstructed** from D2A and
Concordia, see method.py).

One tick of the game master: every need decays toward its baseline; the students act once each in a random order,
each running the planner (**propose** m feasible (action, target) pairs, **evaluate** their SVO utility from the
deficit-weighted need changes of self and, through theory of mind, of the target, **select** through the agent
policy, **reflect**: the target updates its affinity toward the actor and both remember the event); then the
teacher acts according to its goal. Branches share the exact state at the branch tick, RNG included, and differ in
the teacher's goal only; the teacher's goal before the branch is neglect, so the neglect branch is the unbranched
run.
"""

from __future__ import annotations

import copy
import functools
import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from tasks.edumirror import method
from tasks.edumirror.config import ACTIONS, EdumirrorConfig, RoleConfig

CATEGORIES = ("relational aggression", "physical aggression", "prosocial", "neutral")
CATEGORY_OF = {"exclude": 0, "rumour": 0, "confront": 1, "help": 2, "comfort": 2, "socialise": 2,
               "report": 3, "withdraw": 3, "study": 3}
TARGETED = ("exclude", "rumour", "confront", "help", "comfort", "socialise")
AGGRESSIVE = ("exclude", "rumour", "confront")
NORM_EXCLUSION = ("exclude", "rumour")
GOALS = ("neglect", "punitive", "individual", "cooperative")
ACTION_INDEX = {a: i for i, a in enumerate(ACTIONS)}
IS_AGGRESSIVE = np.array([a in AGGRESSIVE for a in ACTIONS])
IS_NORM_EXCLUSION = np.array([a in NORM_EXCLUSION for a in ACTIONS])
HELP = ACTION_INDEX["help"]
SAFETY, BELONGING, ESTEEM = 0, 1, 2
# The sweep scales each group on its own. The three teacher groups are separate so that counselling, the class
# meeting and punishment can vary independently (their ratio decides the intervention ordering).
STUDENT_EFFECT_GROUPS = ("aggression", "prosocial")
TEACHER_EFFECT_GROUPS = ("teacher_punitive", "teacher_individual", "teacher_cooperative")
EFFECT_GROUPS = STUDENT_EFFECT_GROUPS + TEACHER_EFFECT_GROUPS


@dataclass(frozen=True)
class Option:
    """One proposed action: its name and its target student (None for untargeted actions)."""

    action: str
    target: int | None


@dataclass(frozen=True)
class AgentView:
    """What an agent knows when it selects: its profile, its needs, its recent memory (for an LLM policy)."""

    index: int
    role: str
    theta: float
    needs: tuple[float, ...]
    memory: tuple[tuple[int, int, str, int | None], ...]


class AgentPolicy(Protocol):
    """The select step: the numeric value-driven policy here, a random baseline, or an LLM (hub.py).

    ``view`` returns the agent's profile, needs and memory when called (built only for a policy that reads it)."""

    def select(self, view: Callable[[], AgentView], options: Sequence[Option], utilities: np.ndarray,
               rng: np.random.Generator) -> int: ...


@dataclass(frozen=True)
class ValueDrivenPolicy:
    """Select with probabilities softmax(U / tau) (the paper's planner, reconstructed)."""

    temperature: float

    def select(self, view: Callable[[], AgentView], options: Sequence[Option], utilities: np.ndarray,
               rng: np.random.Generator) -> int:
        p = method.softmax_probabilities(utilities, self.temperature)
        return int(rng.choice(len(options), p=p))


@dataclass(frozen=True)
class World:
    """The fixed rules of a classroom: effect vectors, the teacher's effect sizes and the agents' knobs."""

    actor_effect: np.ndarray       # (n_actions, 5)
    target_effect: np.ndarray      # (n_actions, 5)
    detection: np.ndarray          # (n_actions,)
    punish: np.ndarray             # (5,)
    counsel: np.ndarray            # (5,)
    punish_public_cost: float
    punish_memory: float
    norm_help: float
    norm_exclude: float
    meeting_period: int
    norm_decay: float
    need_target: float
    need_baseline: float
    decay_rate: float
    priorities: np.ndarray
    beta: float
    proposals: int
    tom_noise_sd: float
    affinity_rate: float
    retaliation_threshold: float
    retaliation_bonus: float
    aggression_bonus: float
    retaliation_risk: float
    memory_size: int


def build_world(cfg: EdumirrorConfig, scales: dict[str, float] | None = None) -> World:
    """The classroom rules from the config; ``scales`` multiplies the effect sizes of a group of actions
    (``aggression``: exclude, rumour, confront; ``prosocial``: help, comfort, socialise; ``teacher_punitive``: the
    punishment's effect and its public cost; ``teacher_individual``: counselling; ``teacher_cooperative``: the
    class-meeting norms) for the sensitivity sweep."""
    scales = {g: 1.0 for g in EFFECT_GROUPS} | dict(scales or {})
    unknown = set(scales) - set(EFFECT_GROUPS)
    if unknown:
        raise ValueError(f"unknown effect groups {sorted(unknown)}; known: {EFFECT_GROUPS}")
    group_of = {a: "aggression" for a in AGGRESSIVE} | {a: "prosocial" for a in ("help", "comfort", "socialise")}
    actor, target, detection = [], [], []
    for name in ACTIONS:
        effect = getattr(cfg.effects, name)
        scale = scales[group_of[name]] if name in group_of else 1.0
        actor.append(np.asarray(effect.actor) * scale)
        target.append(np.asarray(effect.target) * scale)
        detection.append(effect.detection)
    t, a = cfg.teacher, cfg.agent
    punitive, individual, cooperative = (scales[g] for g in TEACHER_EFFECT_GROUPS)
    return World(
        actor_effect=np.array(actor), target_effect=np.array(target), detection=np.array(detection),
        punish=np.asarray(t.punish) * punitive, counsel=np.asarray(t.counsel) * individual,
        punish_public_cost=t.punish_public_cost * punitive, punish_memory=t.punish_memory,
        norm_help=t.norm_help * cooperative, norm_exclude=t.norm_exclude * cooperative, meeting_period=t.meeting_period,
        norm_decay=t.norm_decay, need_target=a.need_target, need_baseline=a.need_baseline,
        decay_rate=a.decay_rate, priorities=np.asarray(a.priorities), beta=a.beta, proposals=a.proposals,
        tom_noise_sd=a.tom_noise_sd, affinity_rate=a.affinity_rate, retaliation_threshold=a.retaliation_threshold,
        retaliation_bonus=a.retaliation_bonus, aggression_bonus=a.aggression_bonus,
        retaliation_risk=a.retaliation_risk, memory_size=a.memory_size)


@dataclass(frozen=True)
class Event:
    tick: int
    actor: int
    action: str
    target: int | None
    detected: bool


@dataclass
class Classroom:
    """The whole mutable state of one timeline (what a checkpoint copies)."""

    roles: list[str]
    theta: np.ndarray
    aggression: np.ndarray
    needs: np.ndarray              # (students, 5)
    affinity: np.ndarray           # (students, students): R_ij, i's affinity toward j
    punish_risk: np.ndarray        # (students,): perceived risk of punishment when detected
    memory: list[list[tuple[int, int, str, int | None]]]
    rng: np.random.Generator
    goal: str = "neglect"
    goal_since: int = 0
    norm: float = 0.0
    tick: int = 0
    events: list[Event] = field(default_factory=list)

    @property
    def n_students(self) -> int:
        return len(self.roles)

    def victims(self) -> list[int]:
        return [i for i, r in enumerate(self.roles) if r == "victim"]


def class_roles(n_agents: int) -> list[str]:
    """Students of a class of ``n_agents`` (teacher included): units of one bully, two followers and one victim
    (one unit per five students, at least one), the rest bystanders. 5 agents: the paper's bullying case."""
    students = n_agents - 1
    units = max(1, students // 5)
    roles = ["bully"] * units + ["follower"] * (2 * units) + ["victim"] * units
    return roles + ["bystander"] * (students - len(roles))


def new_classroom(cfg: EdumirrorConfig, roles: Sequence[str], victim_needs: float, seed_sequence: Sequence[int]
                  ) -> Classroom:
    """A classroom at tick 0: role profiles from the config, the victims' initial needs given."""
    role_cfg: dict[str, RoleConfig] = {r: getattr(cfg.scenario, r) for r in ("bully", "follower", "victim",
                                                                              "bystander")}
    n = len(roles)
    needs = np.array([[victim_needs if r == "victim" else role_cfg[r].initial_needs] * 5 for r in roles])
    affinity = np.zeros((n, n))
    bullies = [i for i, r in enumerate(roles) if r == "bully"]
    for i, r in enumerate(roles):  # followers start attached to the bullies (a formative memory)
        if r == "follower":
            affinity[i, bullies] = 0.5
    return Classroom(roles=list(roles), theta=np.array([role_cfg[r].theta for r in roles]),
                     aggression=np.array([role_cfg[r].aggression for r in roles]), needs=needs,
                     affinity=affinity, punish_risk=np.zeros(n), memory=[[] for _ in roles],
                     rng=np.random.default_rng(list(seed_sequence)))


@functools.lru_cache(maxsize=4096)
def feasible_options(n_students: int, actor: int) -> tuple[Option, ...]:
    """Every (action, target) the actor can take: targeted actions toward each other student, the rest alone."""
    options = [Option(a, j) for a in TARGETED for j in range(n_students) if j != actor]
    return tuple(options + [Option(a, None) for a in ACTIONS if a not in TARGETED])


def propose(world: World, room: Classroom, actor: int) -> list[Option]:
    """Propose: m feasible options drawn without replacement."""
    options = feasible_options(room.n_students, actor)
    m = min(world.proposals, len(options))
    picked = room.rng.choice(len(options), size=m, replace=False)
    return [options[k] for k in picked]


def evaluate_options(world: World, room: Classroom, actor: int, options: Sequence[Option]) -> np.ndarray:
    """Evaluate: U = cos(theta) U_self + sin(theta) U_other for each option.

    U_self: deficit-weighted perceived change of the actor's needs, plus the aggression trait's bonus, minus the
    perceived punishment risk and the risk of attacking a healthy target, plus retaliation against a disliked one.
    U_other: the target's deficit-weighted need change under the actor's theory-of-mind estimate of the target's
    needs, weighted by clip(1 + R_ij, 0, 1) (neutral relations count fully, hostile ones less).
    """
    m = len(options)
    actions = np.array([ACTION_INDEX[o.action] for o in options])
    has_target = np.array([o.target is not None for o in options])
    targets = np.array([o.target if o.target is not None else actor for o in options])
    aggressive = has_target & IS_AGGRESSIVE[actions]
    w_self = method.deficit_weights(room.needs[actor], world.need_target, world.priorities, world.beta)
    perceived = world.actor_effect[actions].copy()
    perceived[actions == HELP, BELONGING] += room.norm * world.norm_help
    perceived[IS_NORM_EXCLUSION[actions], ESTEEM] -= room.norm * world.norm_exclude
    u_self = perceived @ w_self
    noise = room.rng.standard_normal((m, 5)) * world.tom_noise_sd
    estimates = method.clip_needs(room.needs[targets] + noise)
    punish_cost = -float(w_self @ world.punish)
    risk = (room.aggression[actor] * world.aggression_bonus
            - room.punish_risk[actor] * world.detection[actions] * punish_cost
            - world.retaliation_risk * (estimates[:, SAFETY] + estimates[:, ESTEEM]) / 20.0
            + world.retaliation_bonus * (room.affinity[actor, targets] < world.retaliation_threshold))
    u_self = u_self + np.where(aggressive, risk, 0.0)
    w_target = method.deficit_weights(estimates, world.need_target, world.priorities, world.beta)
    regard = np.clip(1.0 + room.affinity[actor, targets], 0.0, 1.0)
    u_other = np.where(has_target, regard * np.einsum("ok,ok->o", w_target, world.target_effect[actions]), 0.0)
    return method.svo_utility(u_self, u_other, room.theta[actor])


def view_of(room: Classroom, actor: int) -> AgentView:
    return AgentView(index=actor, role=room.roles[actor], theta=float(room.theta[actor]),
                     needs=tuple(float(x) for x in room.needs[actor]), memory=tuple(room.memory[actor]))


def remember(world: World, room: Classroom, agent: int, item: tuple[int, int, str, int | None]) -> None:
    room.memory[agent].append(item)
    del room.memory[agent][:-world.memory_size]


def act(world: World, room: Classroom, actor: int, option: Option) -> Event:
    """Apply an action's effects, roll its detection, and reflect (affinity and memory)."""
    a = ACTION_INDEX[option.action]
    room.needs[actor] = method.clip_needs(room.needs[actor] + world.actor_effect[a])
    detected = bool(room.rng.random() < world.detection[a])
    j = option.target
    item = (room.tick, actor, option.action, j)
    if j is not None:
        room.needs[j] = method.clip_needs(room.needs[j] + world.target_effect[a])
        room.affinity[j, actor] = method.affinity_update(room.affinity[j, actor],
                                                         float(world.target_effect[a].sum()), world.affinity_rate)
        remember(world, room, j, item)
    remember(world, room, actor, item)
    if option.action == "report":  # a report exposes the aggression the reporter suffered this tick and the last
        room.events = [Event(e.tick, e.actor, e.action, e.target, True)
                       if (e.target == actor and e.action in AGGRESSIVE and e.tick >= room.tick - 1) else e
                       for e in room.events]
    return Event(room.tick, actor, option.action, j, detected)


def teacher_acts(world: World, room: Classroom) -> None:
    """The teacher pursues its goal: neglect does nothing; punitive punishes detected aggression of this tick
    (publicly: the victim is named, the punished agent resents the victim); individual counsels the student it
    estimates neediest; cooperative holds a class meeting every ``meeting_period`` ticks, which changes what the
    students *perceive* helping and excluding to be worth (their goals), never the effects themselves."""
    if room.goal == "neglect":
        return
    if room.goal == "punitive":
        for e in room.events:
            if e.tick == room.tick and e.detected and e.action in AGGRESSIVE:
                room.needs[e.actor] = method.clip_needs(room.needs[e.actor] + world.punish)
                room.punish_risk[e.actor] = min(1.0, room.punish_risk[e.actor] + world.punish_memory)
                room.needs[e.target, BELONGING] = max(0.0, room.needs[e.target, BELONGING]
                                                      - world.punish_public_cost)
                room.affinity[e.actor, e.target] = max(-1.0, room.affinity[e.actor, e.target]
                                                       - world.affinity_rate * world.punish_public_cost)
    elif room.goal == "individual":
        estimates = room.needs.mean(axis=1) + room.rng.standard_normal(room.n_students) * world.tom_noise_sd
        neediest = int(np.argmin(estimates))
        room.needs[neediest] = method.clip_needs(room.needs[neediest] + world.counsel)
    elif room.goal == "cooperative":
        if (room.tick - room.goal_since) % world.meeting_period == 0:
            room.norm = 1.0
    else:
        raise ValueError(f"unknown teacher goal {room.goal!r}; known: {GOALS}")


def step(world: World, room: Classroom, policy: AgentPolicy) -> None:
    """One tick of the game master's clock."""
    room.needs = method.clip_needs(method.decay_toward_baseline(room.needs, world.need_baseline, world.decay_rate))
    for actor in room.rng.permutation(room.n_students):
        actor = int(actor)
        options = propose(world, room, actor)
        utilities = evaluate_options(world, room, actor, options)
        choice = policy.select(functools.partial(view_of, room, actor), options, utilities, room.rng)
        room.events.append(act(world, room, actor, options[choice]))
    teacher_acts(world, room)
    room.norm *= 1.0 - world.norm_decay
    room.tick += 1


def run(world: World, room: Classroom, policy: AgentPolicy, until: int) -> np.ndarray:
    """Advance to tick ``until``; returns the needs after each tick, (until - tick, students, 5)."""
    trajectory = []
    while room.tick < until:
        step(world, room, policy)
        trajectory.append(room.needs.copy())
    return np.array(trajectory).reshape(-1, room.n_students, 5)


def branch(room: Classroom, goal: str) -> Classroom:
    """A counterfactual timeline: an exact copy of the state (RNG included) whose teacher pursues ``goal``."""
    if goal not in GOALS:
        raise ValueError(f"unknown teacher goal {goal!r}; known: {GOALS}")
    copied = copy.deepcopy(room)
    copied.goal = goal
    copied.goal_since = room.tick
    return copied


def fingerprint(room: Classroom) -> str:
    """sha256 of the timeline's state apart from the teacher's goal: needs, affinity, risks, norm, memory,
    event log, clock and the RNG's state."""
    h = hashlib.sha256()
    for array in (room.needs, room.affinity, room.punish_risk, room.theta, room.aggression):
        h.update(np.ascontiguousarray(array).tobytes())
    h.update(repr((room.norm, room.tick, room.memory, room.events, room.rng.bit_generator.state)).encode())
    return h.hexdigest()


@dataclass(frozen=True)
class BranchedRun:
    """Victim needs per branch and the integrity checks of one branched classroom."""

    victim_final: dict[str, np.ndarray]      # goal -> (5,) mean victim needs at the last tick
    trajectories: dict[str, np.ndarray]      # goal -> (ticks + 1, students, 5)
    shared_state_ok: bool                    # every branch's state at the branch tick equals the checkpoint's
    neglect_matches_unbranched: bool | None  # the neglect branch is bit-identical to an unbranched run
    events: list[Event]


def branched_run(world: World, room: Classroom, policy: AgentPolicy, branch_tick: int, ticks: int,
                 check_unbranched: bool = True) -> BranchedRun:
    """Run to the branch tick, branch into the four teacher goals, run each to the end."""
    reference = copy.deepcopy(room) if check_unbranched else None
    start = room.needs.copy()[None]
    before = run(world, room, policy, branch_tick)
    checkpoint = fingerprint(room)
    finals, trajectories, shared = {}, {}, True
    events: list[Event] = []
    victims = room.victims()
    for goal in GOALS:
        timeline = branch(room, goal)
        shared &= fingerprint(timeline) == checkpoint
        after = run(world, timeline, policy, ticks)
        trajectories[goal] = np.concatenate([start, before, after])
        finals[goal] = timeline.needs[victims].mean(axis=0)
        if goal == "neglect":
            events = timeline.events
            neglect_end = fingerprint(timeline)
    matches = None
    if reference is not None:
        unbranched = np.concatenate([start, run(world, reference, policy, ticks)])
        matches = bool(np.array_equal(unbranched, trajectories["neglect"]) and fingerprint(reference) == neglect_end)
    return BranchedRun(finals, trajectories, bool(shared), matches, events)


# --- E3: the public-goods game -------------------------------------------------------------------------------


def public_goods_run(theta: float, n_agents: int, rounds: int, multiplier: float, temperature: float,
                     affinity_rate: float, rng: np.random.Generator, random_policy: bool = False) -> np.ndarray:
    """Contribute (1) or free-ride (0) decisions, (rounds, agents), of agents sharing SVO angle ``theta``.

    Each agent weighs the summed gain of the others by clip(1 + R_ij, 0, 1) averaged over the others, so the
    utility difference at neutral affinity is method.public_goods_utility_difference; after each round every agent
    reflects (R_ij moves up toward contributors, down toward free-riders). ``random_policy`` is the baseline of
    agents without values (each option with probability 1/2)."""
    u_self, u_other = method.public_goods_gains(multiplier, n_agents)
    affinity = np.zeros((n_agents, n_agents))
    choices = np.zeros((rounds, n_agents), dtype=np.int64)
    off_diagonal = ~np.eye(n_agents, dtype=bool)
    for r in range(rounds):
        regard = np.clip(1.0 + affinity, 0.0, 1.0)
        regard = (regard * off_diagonal).sum(axis=1) / (n_agents - 1)
        gain = method.svo_utility(u_self, u_other * regard, theta)
        if random_policy:
            p_contribute = np.full(n_agents, 0.5)
        else:
            p_contribute = 1.0 / (1.0 + np.exp(-np.clip(gain / temperature, -50, 50)))
        choices[r] = rng.random(n_agents) < p_contribute
        signed = np.where(choices[r] == 1, 1.0, -1.0)
        affinity = np.clip(affinity + affinity_rate * np.tanh(signed)[None, :] * off_diagonal, -1.0, 1.0)
    return choices
