from kvstore.tiers.bench import main

main()
