"""Planning the workflow's jobs, torch-free (the Snakefile imports it): which networks train
or are evaluated together (:mod:`.batches`), each job's resources (:mod:`.resources`, with
the kernel models' memory plans of :mod:`crosslip.kernel_memory`), the best models'
selection (:mod:`.selection`), the code digest that reruns a job when its code changes
(:mod:`.tracking`), a job's list-valued inputs (:mod:`.files`) and the run lock
(:mod:`.runlock`)."""
