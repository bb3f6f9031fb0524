"""The live ward: readings arriving one at a time from monitors and the laboratory, scored as they come.

``codes`` (which coded reading is which model input, from ``codes.csv``), ``values`` (units converted and plausible
ranges, from ``ranges.csv``), ``fhir`` (FHIR R4 resources in, readings out), ``resources`` (the FHIR resources
answered), ``store`` (the database every reading and score is kept in), ``scoring`` (a bed's risk and drivers from
its record so far; its alert by the run's policy, ``garlic.metrics.alert_policy``), ``monitor`` (the scoring loop), ``service`` (the
HTTP service, ``garlic monitor``), ``watch`` (a folder of record files taken as they grow, ``--watch``), ``feed``
(recorded stays streamed in, ``garlic feed``) and ``access`` (who may reach a server of patient records).
``docs/live.md`` says how to run and connect them.
"""
