"""What a run leaves behind: the MLflow store and its runs (``store``; a run's model folder found without MLflow,
``local_store``), what the stores hold, asked in one place (``queries``), what a run records and the check that its
data are unchanged (``run_contract``), the runs kept beside the tables and studies (``archive``), and the figures
logged with every run (``plots``). The saved model folder is ``garlic.methods.model_files``'s."""
