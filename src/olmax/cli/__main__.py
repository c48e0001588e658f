from olmax.cli import main

main()
