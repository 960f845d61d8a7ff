"""Home of the condensation family (FedDC, FedDC+, FedDM, FedAF): what goes on the wire
(:mod:`.wire`), the server's pool of received sets (:mod:`.pool`), its training of the global model
on them with the nested ``[algorithm.server]`` parameters (:mod:`.server`), FedAF's knowledge
matching (:mod:`.knowledge`), and the shared parameters and aggregation-free base (:mod:`.base`).
The methods themselves stay one file each in :mod:`fedskew.algorithms`.
"""
