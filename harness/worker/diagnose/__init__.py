"""Why a cell failed, inside its environment: ``blame`` (the blame ladder), ``divergence`` (the
first diverging node), ``onnx_reference`` (what the ONNX reference evaluator can judge),
``repro`` (upstream repro bundles), ``bundle`` (a failing cell's bundle), ``reduce`` (the
smallest failing graph, driven by ``harness.run.post.reduce``)."""
