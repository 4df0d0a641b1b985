from decodegap.cli import main

main()
