from rooftop.cli import main

main()
