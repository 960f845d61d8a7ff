"""Real deployments over Flower (``pip install "fedskew[flower]"``).

The same algorithm file runs in the simulator and on Flower: :mod:`.server_app` runs the simulator's
round loop as a Flower ServerApp with the clients on SuperNodes, :mod:`.client_app` runs
``client_step`` as a Flower ClientApp on each node's own data, :mod:`.messages` converts messages
without loss, and :mod:`.app` writes the app folder that ``flwr run`` sends (``fedskew deploy init``).
Nothing outside this package imports Flower.
"""
