"""``preempt``'s torch-free side: a job's file operations and the crash points chosen among
them, its step lines, the verdict at each point, and the record ``verify`` re-derives. Nothing
here runs a process or reads a file the job wrote, but the record."""
