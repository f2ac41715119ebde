from keyturn.cli import main

main()
