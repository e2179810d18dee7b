"""The session view: what one cycle's session looks like right after its actions, as a contract value.

Placement attaches it to a proposal when a work item asks (`want_view`); the conformance runner reads the
same view in-process and over the bus, so both modes observe exactly the same thing.
"""

from __future__ import annotations

from shared.contracts.messages import JobView, NodeView, SessionView, TaskView
from shared.core.scheduler import fit_error_message
from shared.core.session import Session
from shared.core.tasks import GPU


def session_view(ssn: Session) -> SessionView:
    tasks = tuple(
        TaskView(
            pod=task.key,
            name=task.name,
            podgroup=task.job.key,
            status=task.status.value,
            node=task.node,
            gpu_groups=tuple(task.gpu_groups),
            gpus_accepted=task.accepted_gpus,
        )
        for task in ssn.tasks.values()
    )
    jobs = tuple(
        JobView(
            podgroup=job.key, fit_error=fit_error_message(job.fit_errors), last_start_time=job.last_start_time
        )
        for job in ssn.jobs.values()
    )
    nodes = tuple(
        NodeView(node=n.name, idle_gpus=n.idle(GPU), releasing_gpus=n.releasing(GPU))
        for n in ssn.cluster.order
    )
    return SessionView(tasks=tasks, jobs=jobs, nodes=nodes)
