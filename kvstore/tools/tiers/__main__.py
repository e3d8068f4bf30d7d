from kvstore.tools.tiers import main

main()
