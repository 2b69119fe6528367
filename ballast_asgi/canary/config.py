"""The ``canary.sequential`` config section: the sequential rule's constants (validated at load).

Mounted in ``config/models.py`` as ``CanaryConfig.sequential``. The defaults
are the ones ``docs/canary.md`` measures; what each one trades is explained
there and in ``ballast_asgi/canary/evidence.py``.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ballast_asgi.canary.evidence import DEFAULT_PARAMS, EvidenceParams
from ballast_asgi.canary.judges import ERROR_SHARE


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


__all__ = ["CanarySequentialConfig"]
