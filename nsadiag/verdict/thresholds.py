"""Every figure a verdict decision compares against, each with where it comes from.

The rules (nsadiag.verdict.rules, .stall, .slow), a process over an attach window
(nsadiag.verdict.window), a machine's load (nsadiag.verdict.load), the pace of progress
(nsadiag.verdict.progress) and slow by size or by defect (nsadiag.verdict.size_or_defect)
read their thresholds from here; the triage (nsadiag.triage.decide) reads the load and cost
bars it shares with them. A figure is either measured (the measurement is named: a report
under reports/, a test) or a chosen margin (the line says what it keeps apart and why it
sits where it does). Changing one changes verdicts: the tests that pin each are named in
the reports and found by the constant's name.
"""

from __future__ import annotations

from nsadiag.probes import frames, sampler

# ---- a stalled process: busy, idle, or in between ----------------------------------------

IDLE_CPU_FRACTION = frames.IDLE_CPU_FRACTION
"""Below this many CPU seconds per wall second a process is idle (waiting); a thread that
received at least this share of the CPU it waited for and used was working. 0.1, defined
beside the stack classification (nsadiag.probes.frames.classify, below the verdicts, reads
it too). A chosen margin: a process blocked in a lock, a queue or a sleep uses next to no
CPU, and a tenth of a core leaves room for the wake-ups of nsadiag's own sampler and the
interpreter's housekeeping; a spin received 28 % of a core beside five burners on two cores,
well above it."""

BUSY_CPU_FRACTION = 0.5
"""At or above this many CPU seconds per wall second a stalled process is busy. A chosen
midpoint: a process computing in one thread uses about one CPU second per second on a quiet
machine and a waiting one about none; what a loaded machine withholds from a spin is read
from its main thread's demand instead (nsadiag.verdict.stall.busy_fraction)."""

BUSY_AT_ONE_LINE = 0.2
"""A main thread that wanted the CPU (on it or on its run queue) this part of the time or
more is not frozen, even when its stacks stand at one line. A chosen margin, twice
IDLE_CPU_FRACTION: a thread blocked in a lock or a condition wants none of it, one busy in
a native call under one line wants nearly all."""

DEFAULT_STALL_WINDOW_S = 30.0
"""The stall window assumed when the evidence does not carry the runner's stall timeout (a
record written before the field existed, evidence built by hand); the runners record theirs
(nsadiag.spec.STALL_TIMEOUT_S by default). A chosen figure, half that default, and so the
stricter of the two: a gap this long before a kill reads as progress stopped."""

WAITING_CPU_SHARE = IDLE_CPU_FRACTION
"""A main thread that was on the CPU or asked for it at most this share of the wall time
since its process's last progress is waiting (a lock, a queue, a sleep), not starting up
(nsadiag.harness.streams): the bar of IDLE_CPU_FRACTION, read from the pulses of the
progress sampler instead of /proc, and the run-queue time counted as use, so a thread a
loaded machine keeps off the CPU is not taken for a waiting one."""

WAITING_MIN_S = 1.0
"""...over at least this many seconds of pulses: a shorter gap between two pulses is one
sampler interval or a few, too few to tell a wait from a pause between two blocks."""

STALL_STRETCH = 10.0
"""A job quiet for this many stall windows of wall time is stalled even when a loaded
machine kept its main threads on the run queue for most of that time, and the verdict says
the machine was contended (nsadiag.harness.streams.StallClock.due, nsadiag.verdict.stall).
A chosen bound: without one, a job starved of the CPU would never stall; ten windows is far
past any slowdown the contention figures of this file call contended."""

# ---- memory growth ---------------------------------------------------------------------------

MIN_GROWTH_STEPS = 3
"""Memory growth per step is fitted over at least this many step ends: with two, the slope
is the difference of two readings, which one allocation freed a step later makes."""

# ---- growth laws over a sweep (nsadiag.sweep) -------------------------------------------

GOOD_R2 = 0.9
"""Below this R², or with a slope within SLOPE_STANDARD_ERRORS of zero, a sweep's fit is
poor: no growth law and no extrapolation is read from it. A chosen margin: a straight line
through measured step times or peaks of a healthy sweep explains nearly all of their spread;
a tenth left unexplained is noise or a different law."""

SLOPE_STANDARD_ERRORS = 2.0
"""...the slope must lie more than this many standard errors from zero: about the 95 %
bound of a normal error, so a flat series with noise does not read as growth."""

SUPER_LINEAR_RESIDUAL = 0.25
"""A quadratic fit that leaves less than this share of the straight line's squared residual
(with a positive curvature) grows faster than linear: the curvature explains at least three
quarters of what the line misses, not one noisy point."""

SUPER_LINEAR_ABOVE = 1.1
"""...and the last point lies at least this factor above the line through the points: a
tenth above it, beyond the run-to-run spread of a step time or a peak on a quiet machine."""

FASTER_THAN_SAVED = 1.5
"""The rest of the peak (what is not saved activations) growing this many times faster than
the saved bytes, from the first to the last OK point of a sweep, is called out: a temporary
or a cache that grows faster than the activations sets the peak. A chosen margin: half as
fast again is growth of another law, not the spread of two readings."""

# ---- the pace of progress ------------------------------------------------------------------

RATE_WINDOW_S = 30.0
"""Progress rates are measured over the heartbeats of the last this many seconds. A chosen
span: long enough for several steps of a small model, short enough that the rate says the
pace at the end of the run rather than its average since the start."""

MIN_RATE_SPAN_S = 1.0
"""A rate needs its events spread over at least this long: a burst of events within a
fraction of a second (a block's hooks firing back to back) says nothing about the pace."""

SILENCE_INTERVALS = 2.0
"""A silence after the last event longer than this many mean intervals between the events
before it (and than MIN_RATE_SPAN_S) is part of the pace: events that came in a burst and
then stopped give the pace since the burst. A chosen margin: one interval is the pace
itself, two are a pause it does not explain."""

# ---- the machine's load ----------------------------------------------------------------------

LOADED_PER_CPU = 1.5
"""A 1-minute load average above this many runnable tasks per usable CPU (besides the job's
own, where its demand was recorded) is a loaded machine. A chosen margin: one task per CPU
is a machine in full use, and with half a task more each runnable task waits for a core a
third of the time."""

STEAL_CONTENDED = 0.1
"""A hypervisor taking this share of the CPU time or more contends with the job. A chosen
margin: a few percent of steal is common on shared cloud machines and changes no timing
verdict; a tenth stretches every timing by a ninth or more."""

GOT_CONTENDED = 0.5
"""A main thread that received less than this share of the CPU it asked for (on-CPU over
on-CPU plus run-queue seconds) was made to wait for a core most of the time."""

SHARED_PER_CPU = 0.5
"""Below contention, a machine is still said to be shared with other work (a report states
it; no verdict changes) when this many runnable tasks per usable CPU besides the job's own
were seen: half a core's worth of other work, a third of LOADED_PER_CPU."""

SHARED_GOT = 0.9
"""...or when a main thread received less than this share of the CPU it asked for: a tenth
of its time spent waiting for a core is noticeable, and no verdict rests on it."""

STEAL_CAP = 0.9
"""Steal is counted at most this share when bounding how much contention can stretch a run
(nsadiag.verdict.load.stretch_limit): it keeps the bound finite for a reading of 100 %
steal between two close /proc/stat readings."""

# ---- slow by size or by defect ---------------------------------------------------------------

MIN_EXPECTED_STEP_S = 0.01
"""Below this expected step time (the dense reference's time here for the step's FLOPs),
Python dispatch, the optimizer and the heartbeat outweigh the arithmetic: two nearly
identical healthy trials of a tiny model measured 0.2x and 690x their expected cost. The
ratio of such a step is too short to mean anything (nsadiag.finding.numbers.cost_ratio)."""

TINY_OP_RATIO = 0.02
"""Ops averaging below this fraction of a dense block's FLOPs per op are tiny. Measured
(reports/verdicts-under-load.md, "Slow by size or by defect"): a per-token attention loop
0.004; the built-in NSA 0.05-0.065 at S = 256, but 0.012 at S = 2048 and width 32: a sparse
model's ops shrink against dense attention's, whose work per op grows with S, so the ratio
alone cannot name a per-token loop (COMPUTE_OPS_PER_TOKEN decides with it)."""

COMPUTE_OPS_PER_TOKEN = 1.0
"""...and tiny ops come from a loop over the tokens when the forward issues at least this
many compute ops (matmuls, convolutions, attention: the ops with a FLOP count) per token and
watched block. Measured per block and forward: a per-token attention loop 2 per token
(4,101 at S = 2048); the built-in NSA 0.04-0.31 (tiny widths, S = 64-4096; 87 at
S = 2048), the tiled CPU backend included."""

HOST_READS_PER_TOKEN = 0.5
"""Host reads (``.item()``, ``.tolist()``) per step at or above this many per sequence
position are a read per token; a loop counter of the model's code that reached this many
per position within one pass counts over the tokens. Measured: the per-token loop reads
once per token per layer (512 at S = 256 with 2 layers); the built-in NSA 32 at S = 256 and
none at paper dims; half a read per position sits between them."""

MIN_HOST_READS = 64
"""...and at least this many: a short sequence's few reads per block are not per token
(the built-in NSA reads 16 per layer at 256 tokens, none at 64)."""

RANGE_OVER_POSITIONS = 2
"""A loop of the model's code whose ``range`` ends within this factor of the sequence
length (and at MIN_HOST_READS or more) is a loop over the positions, however far it got:
a loop over S or S + 1 positions, or over the S - 1 pairs of neighbours, is one; a loop
over layers or heads ends far below S."""

DEFECT_COST_RATIO = 100.0
"""A step taking this many times the dense reference's time for its FLOPs or more is slow
for its work, whatever the counts say. The ratio is a timing and a noisy one at small
widths (measured on 2 shared cores: the per-token loop 15-250x at S=512 and 24x at S=64
from run to run, the built-in NSA 1.5-6x), so the bar sits where no healthy model came
near it; the counts decide the common defects."""

# ---- the slow cause (nsadiag.verdict.slow_cause) -------------------------------------------

DATA_BOUND_SHARE = 0.5
"""A SLOW run is data-bound when its main thread sat in the DataLoader's ``__next__`` (waiting
for a batch, or loading it) in at least this share of its samples once training began: the
input pipeline then takes more of the run than everything else together. Measured on 2
shared cores (load average 7-10): repro/scripts/slow_storage_loader.py (two workers, 100 ms
reads, a tiny model) 0.73 and 0.94 quiet, 0.70 with two CPU burners; the same script with
a model that outweighed its reads (20 ms reads, 0.16) and one close to even (80 ms reads,
0.49) stayed below it."""

DATA_LARGEST_SHARE = 0.4
"""Below DATA_BOUND_SHARE a SLOW run is still data-bound when its main thread sat in the
DataLoader's ``__next__`` in at least this share of its samples once training began AND in
more of them than in any one other phase (the forward outside ``__next__``, the backward,
the rest): the input pipeline is then the largest single part of the step. On a contended
machine the model's own work slows with the CPUs while a read's sleep does not, so the
data share falls: repro/scripts/slow_storage_loader.py (69 % quiet) gave 0.68, 0.58, 0.87
and 0.49 under two CPU burners on 2 shared cores (load 12-13), the last with 56 samples in
``__next__`` against 43 in the backward; the same script with 20 ms reads (0.16) stays
out."""

MIN_RECOMPILES = 3
"""A SLOW run's cause is recompiles only when Dynamo compiled again at least this many
times: a compiled run whose shapes change once pays one recompile (Dynamo then marks the
dimension dynamic by itself), and a chosen margin above that."""

COMPILE_BOUND_SHARE = 0.3
"""...and its main thread was inside the compiler in at least this share of its samples
once training began. A chosen bound below what the defect gives: measured on 2 shared
cores, repro/scripts/compiled_variable_lengths.py (a new length every step, dynamic=False)
0.72-0.88 quiet, 0.82 with two CPU burners. A run that compiles once spends only its first
steps there, a share that falls as the run goes on."""

RECOMPUTE_SHARE = 0.5
"""A SLOW run's cause is checkpoint recompute when torch.utils.checkpoint's recompute of the
forward holds at least this share of the backward's samples. By FLOPs a checkpointed
block's backward is its recompute (one forward) plus the gradients (about two forwards), a
third of it; above half, the recomputed forward costs more than the gradients themselves.
Measured on 2 shared cores: repro/scripts/checkpoint_recompute.py (a no-grad routing inside
the checkpointed block) 0.77-0.78 quiet, 0.64 with two CPU burners."""

HOSTS_PUBLISH_EVERY_S = 2.0
"""Each host's nsadiag publishes its ranks' state to the job's store at most this often
(nsadiag.hosts.shared): one JSON value of a few kB per host, so 256 hosts cost the store
128 sets a second, and a peer's view is never older than the stall timeouts in use (10 s
and up) can notice."""

HOSTS_STORE_TIMEOUT_S = 2.0
"""A store operation that has not answered in this long has failed: the store's host is
gone or unreachable. On loopback an operation answers in well under a millisecond and
across a data-centre network in a few; two seconds never delays the watch by more than
one poll interval twice."""

HOSTS_CAPTURE_MARGIN_S = 10.0
"""After its own capture a host waits for every other host's capture for its capture
window plus this long before it kills its ranks: a peer notices the shared stall signal
within one poll (under a second) and then samples for the same capture window; ten
seconds covers a loaded peer (measured with tests/nsadiag/hosts/test_multihost.py on 2 shared
cores at load 7-13, four runs: the second host's capture was published 0.1-0.9 s after
the first's, each capture taking 15-25 s)."""

HOSTS_LOST_AFTER_S = 3 * HOSTS_PUBLISH_EVERY_S
"""A host that published nothing for this long (three publishing intervals), while the
other hosts' ranks lost their peers, is lost (its machine, or its nsadiag, is gone)."""

HOSTS_STALL_LOOK_S = 1.0
"""While the job runs each host looks for the shared stall signal at most this often (one
store operation): with a digest every HOSTS_PUBLISH_EVERY_S and the decider's finding read
every fifth publication, a host costs the store under 2 operations a second, so 1,000 hosts
cost it under 2,000; a peer joins a stall's capture at most a second after it is said."""

HOSTS_DECIDER_MARGIN_S = 5.0
"""At a stall a host waits for the decider's request this long past the capture window and
HOSTS_CAPTURE_MARGIN_S; then the decider is lost, and the next host in the deciding order
that captured decides in its place."""

STRAGGLER_STEPS = 5
"""A straggler stands out at each of its latest this many finished steps (step 0 left out;
nsadiag.verdict.straggler): one slow step is a hiccup of the machine (a descheduled
process, a page-fault storm), five in a row are the rank's own. Even ranks on a loaded
machine had the largest own time of a step up to 8 steps in a row (below), so the
persistence alone would not do: the ratio is taken over the five steps' least."""

STRAGGLER_RATIO = 2.0
STRAGGLER_MIN_GAP_S = 0.05
"""A straggler's least own time (outside collectives) over those steps is at least this
many times, and this many seconds more than, the median of the other ranks' own times.
Measured with tests/multihost_straggler.py, 2 hosts x 2 gloo ranks on 2 shared cores, 60
steps: with even ranks of about 0.08 s own time per step (--width 4096) the largest rank's
own time was up to 2.7x the others' median at single steps, but its least over five steps
at most 1.48x the others' (load 9) and 1.54x with two CPU burners (load 8-9); a rank
that sleeps 0.15 s more per step stood at 2.8-2.9x, its least 2.6x (burners, load 9-12),
and one that sleeps 0.3 s on a tiny model at 180-220x. The gap keeps a tiny model from
deciding: its even ranks spend about 1 ms per step outside collectives, where one rank
was up to 7x the others at single steps with gaps of at most 8 ms (load 5-6)."""

STRAGGLER_KEEP_RATIO = 1.6
STRAGGLER_KEEP_GAP_S = 0.03
"""Once named, a straggler is kept while its least own time over its latest steps stays at
this many times, and this many seconds more than, the others' median (a lower bar than the
one that names it: a rank near STRAGGLER_RATIO would otherwise come and go between two
reads of the store). Both stay above what even ranks showed in the measurements above:
the largest least own time of even ranks was 1.54x the others' median (two CPU burners,
load 8-9), and their gaps on a tiny model at most 8 ms; a rank named at 2.0x is dropped
once its least falls by a fifth."""

# ---- the observer's own cost in a watched process ----------------------------------------

BLOCK_HOOK_CALL_S = 10e-6
"""What one call of a watched block costs the training thread, among the unwatched blocks
of a thinned model: torch's module call with a forward hook (``Module._call_impl`` leaves
its fast path) and nsadiag's pre-hook (``WorkCounters.block_hook``), over the same call
without them. A call in a run of hooked calls costs less, its path warm: bench/
bench_block_hooks.py (torch 2.13 CPU, 2 shared cores, a block of Linear, LayerNorm and GELU,
width 32, batch 16, in training mode, 200 alternated chunks of 200 calls) gave 4.8 us at
load 6.7. Inside the 64-block model's step, every block hooked cost 5.3 us a hooked call,
one block in 9 or in 21 hooked 7 to 11 us (the median over 40 alternated rounds of 50
steps, quiet machine): a hooked call among unhooked ones runs torch's slower path from cold
caches. The figure for the thinned case, which is the one the budget decides."""

BLOCK_HOOK_BUDGET = 0.005
"""The share of the training thread's CPU time per step that the watched blocks' pre-hooks
may cost (BLOCK_HOOK_CALL_S per hooked call); above it only one block in so many keeps its
hook (nsadiag.harness.thinning). A chosen margin: the observer's whole budget is 5 % of a
step (issue 32); on a model of 7 ms steps the sampler and its hand-offs of the GIL took
about 1.5 %, the step event and the marks' stack walks about 1 %, and the memory marks keep
to MARK_BUDGET, so the block hooks get half a percent (64 blocks of 0.1 ms: one in 17 or
18 keeps its hook)."""

BLOCK_HOOK_SAMPLE_STEPS = 4
"""The steps after the one that found the model over which the blocks' calls and the
training thread's CPU time are read for that decision. The first step is left out (it
finds and hooks the model, and a compiled model compiles in it); a chosen count, enough to
average out one slow step (a logging step, a checkpoint) and short against any run worth
watching."""

MARK_BUDGET = sampler.MARK_BUDGET
"""The share of the wall time the memory marks at each top-level model call may take on
the model's thread; over it a mark reads nothing and a rise goes to the frames on every
stack since the last reading. 0.005, defined beside the marks (nsadiag.probes.sampler, below
the verdicts), with its measurement there."""


OUTSIDE_WORK_SHARE = 0.2
"""A SLOW run's time goes to a line of its own outside the model when the training samples
outside the model's modules, its backward and its optimizer's step hold at least this
share, most at one user line (``outside-model``); under it, and with no other cause class,
the time is the model's own work (``model-compute``). An honest loop's own lines outside
those three (the loss of a module's output, a print every ten steps) held 1.6 % of the
samples in a 3-layer 4096-wide MLP trained with AdamW (4 of 252 samples, /tmp/h/honest.py
of the causes work, 2 shared cores at load 3); a loss whose ``[B, 1] - [B]`` broadcast
builds a ``[B, B]`` tensor at B = 4096 holds 26 % and up. One fifth keeps both far from the
bar."""
OWN_WORK_SHARE = 0.8
"""A SLOW run's time is the model's own work (no defect found) only when its modules'
forward, its backward and its optimizer's step hold at least this share of the training
samples: 99 % in the honest MLP above (235 of 238), so a run whose data waits or other
work stay under every class's bar but still hold a fifth is left without a class."""
INNER_LOOP_PER_STEP = 4
INNER_LOOP_MIN = 200
"""A loop of the user's code that iterates this many times a step (or, with no step
recorded, this many times in all) is Python work inside the steps, never the model's own
work: repro/scripts/slow_token_loop.py's loop over tokens iterated 3,430 times in 85 steps
(40 a step) while its samples fell under the model's modules; a training loop iterates once
a step, and a loop over a handful of layers or heads a few times."""
MIN_WORK_SAMPLES = 20
"""Fewer training samples than this (two seconds at the sampler's ten a second) say nothing
about where the time goes."""

