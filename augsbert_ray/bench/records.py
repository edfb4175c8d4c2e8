"""What ``augsbert bench`` measured: plain records that round-trip through JSON.

A ``Measure`` is one figure (an engine's or a peer's); a ``PartResult`` is one part of the
benchmark (labelling, BM25, ...) with its figures, notes and status; a ``BenchReport`` is
the whole run with the machine it ran on. Nothing here needs Ray, torch or a model.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

SIDES = ("engine", "peer", "info")


@dataclass
class Measure:
    """One figure.

    Args:
        name: what was measured, e.g. ``"engine: Ray pipeline, 2 actors, steady"``.
        value: the figure (None: not measured, say why in ``note``).
        unit: ``pairs/s``, ``queries/s``, ``s``, ``MiB``, ``recall@3``...
        side: ``engine`` (augsbert-ray), ``peer`` (what a user would otherwise run) or ``info``.
        vs: the name of the peer measure (same part, same unit) this one is compared with.
        note: how it was measured, in a few words.
    """

    name: str
    value: float | None
    unit: str
    side: str = "engine"
    vs: str | None = None
    note: str = ""

    def __post_init__(self):
        if self.side not in SIDES:
            raise ValueError(f"unknown side '{self.side}'; valid: {', '.join(SIDES)}")


@dataclass
class PartResult:
    """One part's outcome: ``ok``, ``failed`` (with the error; what it measured before is kept)
    or ``skipped`` (with the reason)."""

    part: str
    title: str
    status: str = "ok"
    error: str | None = None
    seconds: float = 0.0
    measures: list[Measure] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    data: dict = field(default_factory=dict)  # the part's own figures (series for the plot, analysis)

    def add(self, *args, **kwargs) -> Measure:
        m = Measure(*args, **kwargs)
        self.measures.append(m)
        return m

    def get(self, name: str) -> Measure | None:
        return next((m for m in self.measures if m.name == name), None)

    def ratio(self, m: Measure) -> float | None:
        """``m`` against the measure it names in ``vs`` (None where either is missing)."""
        ref = self.get(m.vs) if m.vs else None
        if ref is None or not ref.value or m.value is None:
            return None
        return m.value / ref.value

    @classmethod
    def from_dict(cls, d: dict) -> PartResult:
        return cls(**{**d, "measures": [Measure(**m) for m in d.get("measures", [])]})


@dataclass
class BenchReport:
    """A whole run: how it was started, where, and each part's result in the order run."""

    mode: str  # quick or full
    command: str
    started: str  # UTC, ISO 8601
    hardware: dict = field(default_factory=dict)
    versions: dict = field(default_factory=dict)
    cluster: str = ""
    load_average: dict = field(default_factory=dict)  # {"start": [1, 5, 15 min], "end": [...]}
    parts: list[PartResult] = field(default_factory=list)

    def part(self, name: str) -> PartResult | None:
        return next((p for p in self.parts if p.part == name), None)

    def put(self, result: PartResult) -> None:
        """Adds a part's result, replacing an earlier one of the same part."""
        self.parts = [p for p in self.parts if p.part != result.part] + [result]

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> BenchReport:
        return cls(**{**d, "parts": [PartResult.from_dict(p) for p in d.get("parts", [])]})
