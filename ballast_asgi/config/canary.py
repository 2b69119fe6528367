"""The ``canary.sequential`` config section: the sequential rule's constants (validated at load).

Mounted in ``config/models.py`` as ``CanaryConfig.sequential``. The defaults
are the ones ``docs/canary.md`` measures; what each one trades is explained
there and in ``ballast_asgi/canary/core/evidence.py``.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ballast_asgi.canary.core.evidence import DEFAULT_PARAMS, EvidenceParams
from ballast_asgi.canary.core.history import HistoryParams
from ballast_asgi.canary.core.judges import CALM_CAP_NATS, ERROR_SHARE

_HISTORY = HistoryParams()


class CanaryHistoryConfig(BaseModel):
    """The warm start: what the judge learns from the stable instances' history (``history.py``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    #: Learn whether stable errors come in bursts (false: the burst cap always).
    enabled: bool = True
    #: Stable history the test needs before it decides (kept recording before and during a canary).
    history_ms: int = Field(int(_HISTORY.history_s * 1000), ge=10_000, le=86_400_000)
    #: Counts per instance are pooled over windows of this long.
    window_ms: int = Field(int(_HISTORY.window_s * 1000), ge=1000, le=600_000)
    #: Dispersion z at or above this: bursty (keep the cap).
    burst_z: float = Field(_HISTORY.burst_z, gt=0.0, le=1000.0)
    #: Fewer stable events than this in the history: undecided (keep the cap).
    min_events: int = Field(_HISTORY.min_events, ge=1, le=10_000_000)
    #: The per-block cap of a metric the history found calm (50: no cap in practice).
    calm_cap_nats: float = Field(CALM_CAP_NATS, gt=0.0, le=50.0)

    @model_validator(mode="after")
    def _window(self) -> CanaryHistoryConfig:
        if self.window_ms > self.history_ms:
            raise ValueError("window_ms must be <= history_ms")
        return self

    def params(self) -> HistoryParams:
        """The pure core's parameters."""
        return HistoryParams(history_s=self.history_ms / 1000.0, window_s=self.window_ms / 1000.0,
                             burst_z=self.burst_z, min_events=self.min_events)  # fmt: skip


class CanarySequentialConfig(BaseModel):
    """How the sequential judge weighs evidence (``rule: sequential`` only)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    #: Share of alpha spent on errors; the rest goes to latency.
    error_share: float = Field(ERROR_SHARE, gt=0.0, lt=1.0)
    #: Most one 1 s block may add to the log e-value, in nats (burst robustness).
    cap_nats: float = Field(DEFAULT_PARAMS.cap_nats, gt=0.0, le=50.0)
    #: A block may add what one canary event adds (when above the cap) at most once per this.
    single_event_gap_ms: int = Field(
        int(DEFAULT_PARAMS.single_event_gap_s * 1000), ge=0, le=3_600_000
    )
    #: The relative risks the mixture covers (canary events per stable event, log-spaced).
    ratio_min: float = Field(DEFAULT_PARAMS.ratio_min, gt=1.0, le=10_000.0)
    ratio_max: float = Field(DEFAULT_PARAMS.ratio_max, gt=1.0, le=10_000.0)
    ratio_points: int = Field(DEFAULT_PARAMS.ratio_points, ge=1, le=64)
    #: Prior weight of relative risk r proportional to ln(r) ** -prior_power (0: uniform).
    prior_power: float = Field(DEFAULT_PARAMS.prior_power, ge=0.0, le=8.0)
    #: The warm start: learn from the stable instances whether errors come in bursts.
    history: CanaryHistoryConfig = CanaryHistoryConfig()

    @model_validator(mode="after")
    def _grid(self) -> CanarySequentialConfig:
        if self.ratio_max < self.ratio_min:
            raise ValueError("ratio_max must be >= ratio_min")
        if (self.ratio_points == 1) != (self.ratio_min == self.ratio_max):
            raise ValueError("ratio_points must be >= 2 unless ratio_min == ratio_max (then 1)")
        return self

    def params(self) -> EvidenceParams:
        """The pure core's parameters."""
        return EvidenceParams(
            ratio_min=self.ratio_min,
            ratio_max=self.ratio_max,
            ratio_points=self.ratio_points,
            prior_power=self.prior_power,
            cap_nats=self.cap_nats,
            single_event_gap_s=self.single_event_gap_ms / 1000.0,
        )


__all__ = ["CanaryHistoryConfig", "CanarySequentialConfig"]
