"""The harness: starting, watching and stopping the processes a diagnosis runs.

launch   start a command (a trial child, torchrun, a user's own script) so that nothing it
         starts outlives the diagnosis
"""
