"""The next step of a stuck run, from the end of its wait chain (nsadiag.verdict.chain):
never from the verdict's name alone.

``chain_next(chain)`` says what to change for each way a chain ends (``ENDS``): a lock
sentence only where a lock is in the chain, end of file for a child reading a pipe this
process holds, a timeout for a polling loop, and so on. None for a chain whose end the
evidence does not name: the caller then says what it knows without a cause.
"""

from __future__ import annotations

from nsadiag.verdict.chain import WaitChain


def _where(chain: WaitChain, index: int) -> str:
    hops = chain.hops
    if not -len(hops) <= index < len(hops) or not hops[index].where:
        return ""
    return f" at {hops[index].where}"


def chain_next(chain: WaitChain) -> str | None:
    """One sentence: what to change where the chain ends (see the module docstring)."""
    subject = chain.subject or "it"
    end = chain.end
    if end == "lock-cycle":
        return (f"Take the locks `{subject}` in the same order in every thread (or hold one "
                f"at a time): each of the two threads holds one and waits for the other"
                f"{_where(chain, 0)}{_where(chain, -1).replace(' at ', ' and ')}.")
    if end == "lock-self":
        return (f"Do not take the lock `{subject}` again while the same thread holds it"
                f"{_where(chain, -1)}: release it before the call that leads to the wait"
                f"{_where(chain, 0)}, or make it a `threading.RLock`.")
    if end == "queue-full":
        return (f"Do not hold the lock `{subject}` across a blocking `put`"
                f"{_where(chain, -1)}: put the item after releasing it (or "
                f"`put(timeout=...)`), since the thread that empties the queue first waits "
                f"for `{subject}`{_where(chain, 0)}.")
    if end == "lock-held":
        return (f"The lock `{subject}` stays held while its holder does what the chain's last hop "
                f"shows{_where(chain, -1)}: release it before that, or do not wait for it"
                f"{_where(chain, 0)}.")
    if end == "lock-lost":
        return (f"Release the lock `{subject}` on every path (a `with` block, or "
                f"`try`/`finally`): it is locked, and no live thread is inside a `with` "
                f"block for it, so an acquire without its release (or a thread that "
                f"has ended) holds it{_where(chain, 0)}.")
    if end == "lock-lost-fork":
        return (f"Do not fork while a thread holds `{subject}`: start the DataLoader workers "
                f"with `multiprocessing_context=\"spawn\"` (or \"forkserver\"), or create the "
                f"lock in each worker (`worker_init_fn`).")
    if end == "producer-died":
        return (f"Fix the exception that ended the thread feeding `{subject}` (the chain names "
                f"it), and have that thread put a sentinel in a `finally` so the wait"
                f"{_where(chain, 0)} ends when it dies (or `get(timeout=...)`).")
    if end == "no-producer":
        return (f"Make sure a thread feeds `{subject}` and puts a sentinel when it ends, or "
                f"wait with a timeout{_where(chain, 0)}: no thread is known to feed it.")
    if end == "pipe-eof":
        return (f"Close the write end before waiting for `{subject}` (`proc.stdin.close()`), "
                f"or use `communicate()` / `subprocess.run(input=...)`, which send end of "
                f"file{_where(chain, 0)}.")
    if end == "child-waits":
        return (f"The child `{subject}` never exits: make what it waits for happen, or wait "
                f"for it with a timeout (`wait(timeout=...)`){_where(chain, 0)}.")
    if end == "file-lock":
        return (f"The process holding the file lock on {subject} waits while it holds it"
                f"{_where(chain, -1)}: release the lock before that wait, or take it here "
                f"with `LOCK_NB` and a retry deadline{_where(chain, 0)}.")
    if end == "worker":
        return (f"The DataLoader worker stands{_where(chain, -1)} and never returns a batch: "
                f"make that line return (run the dataset with `num_workers=0` to see it "
                f"alone), or set the DataLoader's `timeout`.")
    if end == "socket-peer":
        return (f"Make `{subject}` answer (the chain's last hop shows where it stands "
                f"instead), and give the socket a timeout (`settimeout(...)`, or the client "
                f"call's `timeout=`) so that a peer that never answers fails the read"
                f"{_where(chain, 0)} rather than holding it.")
    if end == "socket-remote":
        return (f"Find why {subject} sends nothing: the read{_where(chain, 0)} waits for it, "
                f"and it is out of sight from this machine; give the socket a timeout "
                f"(`settimeout(...)`, or the client call's `timeout=`) so that a peer that "
                f"never answers fails the step rather than holding it.")
    if end == "uneven-steps":
        return (f"Give every rank the same number of steps (a `DistributedSampler` with "
                f"`drop_last=True`, or DDP's `join` context): the ranks' steps differ "
                f"({subject}), so a rank waits after its last step while another waits in "
                f"the gradient collective of a step it never began.")
    if end == "poll":
        return (f"Add a timeout to the polling loop{_where(chain, 0)} (raise once "
                f"`{subject}` has held past a deadline), and make sure what should end it "
                f"runs.")
    return None
