"""Many hosts, one verdict: each host's ``nsadiag run`` names its ranks by host, global,
local and node rank (nsadiag.ranknames), meets the other hosts in the store the job
already has (address: torchrun's c10d rendezvous store, else MASTER_ADDR:MASTER_PORT's), shares its
ranks' state and its captured evidence there (link, shared), and decides one verdict over
every host's ranks (merged); ``nsadiag merge DIR...`` decides the same from run
directories copied together afterwards."""
