"""Many hosts, one verdict: each host's ``nsadiag run`` names its ranks by host, global,
local and node rank (nsadiag.ranknames), meets the other hosts in the store the job
already has (address: torchrun's c10d rendezvous store, else MASTER_ADDR:MASTER_PORT's),
publishes a digest of its ranks there (link, digest, shared); one decider (decider) reads
every digest, and at a stall folds the hosts' ranks into groups (groups) and gathers the
captures of the suspects, over which every host decides one verdict (merged);
``nsadiag merge DIR...`` decides the same from run directories copied together
afterwards."""
