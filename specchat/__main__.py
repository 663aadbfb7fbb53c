from specchat.launch import main

main()
