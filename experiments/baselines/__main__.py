from experiments.baselines.run import main

main()
