from rooftop.cli import main

if __name__ == "__main__":  # not when multiprocessing's spawn imports the main module in a child
    main()
