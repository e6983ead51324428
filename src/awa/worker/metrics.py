"""The worker's ``/metrics`` page: Prometheus text of this process's counters and gauges.

Read from the runtime's parts on each scrape: claims per queue (the
dispatchers), completions (the completer), failures, retries and cancels per
queue (the runner's outcome counts, named by `awa.core.outcomes`), handlers
in flight (the attempts table), rescues and leadership (maintenance).
"""

from __future__ import annotations

from collections.abc import Mapping

from awa.core.outcomes import OUTCOMES
from awa.maintenance.leader import LeaderElection
from awa.maintenance.services import Rescuer
from awa.telemetry import otel as telemetry
from awa.worker.attempts import Attempts
from awa.worker.completion import Completer
from awa.worker.dispatcher import Dispatcher


def metrics_text(dispatchers: Mapping[str, Dispatcher], completer: Completer,
                 outcomes: Mapping[tuple[str, str], int], attempts: Attempts,
                 rescuer: Rescuer, leader: LeaderElection) -> str:
    """Prometheus text exposition of one worker's counters and gauges."""
    lines = []

    def metric(name: str, kind: str, help_: str, samples: list[tuple[str, float]]) -> None:
        lines.extend([f"# HELP {name} {help_}", f"# TYPE {name} {kind}"])
        lines.extend(f"{name}{labels} {value}" for labels, value in samples)

    def per_queue(values: dict[str, float]) -> list[tuple[str, float]]:
        return [(f'{{queue="{telemetry.prometheus_label(q)}"}}', v) for q, v in values.items()]

    metric("awa_job_claimed_total", "counter", "Jobs claimed by this process.",
           per_queue({n: d.claimed for n, d in dispatchers.items()}))
    metric("awa_job_completed_total", "counter", "Completions written by this process.",
           [("", completer.completed)])
    for kind, spec in OUTCOMES.items():  # besides completions (above)
        if spec.metric_help is not None:
            metric(f"awa_job_{spec.telemetry}_total", "counter",
                   f"{spec.metric_help} by this process.",
                   per_queue({n: outcomes.get((kind, n), 0) for n in dispatchers}))
    in_flight = attempts.per_queue()
    metric("awa_job_in_flight", "gauge", "Handlers running now.",
           per_queue({n: in_flight[n] for n in dispatchers}))
    metric("awa_maintenance_rescues_total", "counter", "Attempts rescued by this leader.",
           [("", rescuer.rescued)])
    metric("awa_maintenance_leader", "gauge", "1 while this process leads maintenance.",
           [("", 1 if leader.is_leader else 0)])
    return "\n".join(lines) + "\n"
