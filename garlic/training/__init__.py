"""How a network is fitted: the one fit loop and its schedules (``trainer``), the objectives of each stage
(``losses``), the state a killed fit resumes from (``state``), data-parallel processes (``distributed``), the
device (``device``) and the CPU threads (``threads``)."""
