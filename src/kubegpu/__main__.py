from kubegpu.cli.main import main

main()
