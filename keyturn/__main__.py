from keyturn.ops.cli import main

main()
