from posprobe.cli import main

main()
