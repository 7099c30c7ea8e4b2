"""Rendezvous: a thread inside torch.distributed's setup (``init_process_group``,
``new_group``; nsadiag.probes.frames.rendezvous_frame), which returns only once every rank
of the group has joined at the same address.

The other processes of the job sampled at the stall that are not in the rendezvous are
the ranks that have not joined: the first is followed into its own threads. None outside
it: the ranks still missing never started under this command (a ``world_size`` larger
than the ranks launched, or ranks started elsewhere, or with another address).
"""

from __future__ import annotations

from nsadiag.probes.frames import RENDEZVOUS_FILE, rendezvous_frame
from nsadiag.verdict.waits.model import (
    MAX_DEPTH,
    End,
    Family,
    Hop,
    WaitChain,
    Waiting,
    at,
    continued,
    label,
    main_thread,
    said_at,
    strip_label,
)


def _follow(waiting: Waiting) -> WaitChain | None:
    thread, own = waiting.thread, waiting.own
    setup = rendezvous_frame(thread)
    if setup is None:
        return None
    call = setup.function.rsplit(".", 1)[-1] if not setup.file.endswith(RENDEZVOUS_FILE) \
        else "init_process_group"
    first = Hop("rendezvous", f"{label(thread)} waits in torch.distributed's `{call}`" +
                (f" at {at(own)}" if own is not None else "") + " for every rank of the group "
                "to join", at(own) if own is not None else None,
                own.code if own is not None else None)
    mains = [(p, m) for p in waiting.others if (m := main_thread(p.sample)) is not None]
    joined = [p for p, m in mains if rendezvous_frame(m) is not None]
    late = [(p, m) for p, m in mains if rendezvous_frame(m) is None]
    if late and waiting.depth < MAX_DEPTH:
        rank, main = late[0]
        inner = waiting.follow(rank, main, (), waiting.depth + 1)
        who = f"{rank.role} (pid {rank.sample.pid})" if rank.role.startswith("rank ") else \
            f"pid {rank.sample.pid}"
        return continued(first, inner, f"{who} has not joined it: "
                                       f"{strip_label(inner.hops[0].text, main)}",
                         "rendezvous-late")
    seen = (f"the {len(joined)} other process{'es' if len(joined) != 1 else ''} of the job "
            f"seen wait{'s' if len(joined) == 1 else ''} in it too, and no other is left to "
            f"join" if joined else "no other process of the job was seen")
    return WaitChain((first, Hop("rendezvous", f"{seen}: the ranks it waits for never "
                                               f"started under this command")),
                     "rendezvous-missing", call)


def _missing(chain: WaitChain) -> str:
    return (f"Start every rank that `{chain.subject}` waits for{said_at(chain, 0)}: it returns "
            f"only once all `world_size` ranks have joined at the same address, and the "
            f"ranks missing never ran under this command. Launch them together "
            f"(`torchrun --nproc_per_node N train.py` sets `RANK`, `WORLD_SIZE` and the "
            f"address for each), or pass the `world_size` of the ranks you really start; "
            f"`timeout=datetime.timedelta(seconds=60)` makes a missing rank fail the call "
            f"instead of hanging.")


def _late(chain: WaitChain) -> str:
    return (f"Make the process that has not joined reach `init_process_group` (it stands "
            f"where the chain's last hop shows{said_at(chain, -1)}), or start the group "
            f"only once every rank is ready; `timeout=datetime.timedelta(seconds=60)` "
            f"makes a rank that never joins fail the call{said_at(chain, 0)} instead of "
            f"hanging.")


FAMILY = Family("rendezvous", _follow, {
    "rendezvous-missing": End("a thread waits in torch.distributed's setup for ranks that "
                              "never started under this command", _missing),
    "rendezvous-late": End("a thread waits in torch.distributed's setup while another "
                           "process of the job stands elsewhere, not joined", _late),
})
