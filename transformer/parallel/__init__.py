"""The parallel room: where arrays live and what processes agree on.

    sharding.py    the device mesh, logical-axis rules, shardings of state, batch and cache
    processes.py   what several processes must agree on (a value from process 0, barriers)
    target.py      what a program is built for: this host, or a TPU/GPU topology compiled
                   ahead of time, and its chips' facts (HBM, peak, links)
    links.py       what a collective costs on the links its group spans: torus ports, DCN
                   between slices, NVLink or the network between GPU hosts (cited)
    gpu_targets/   XLA's description of each GPU target (data: *.txtpb)

May import: config/, model/ (for its logical axis names). Never: data/, train/, generate/,
hf/, scaling/, tools/.
"""
