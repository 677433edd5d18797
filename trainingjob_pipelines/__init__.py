"""TrainingJobs as steps of a Kubeflow Pipelines (KFP v2) pipeline.

Why a package of its own: the component (`trainingjob_pipelines.component`) imports `kfp`, which the
operator never needs, so it stays out of `controller`, `trainingjob_client` and the operator's image
(the Dockerfile copies neither this package nor kfp, and kfp is only in the `pipelines` extra). The
step's work itself (`trainingjob_pipelines.step`) needs no kfp: it runs inside the pipeline's pod on the
Python client, and unit tests call it directly. docs/pipelines.md has the tour.
"""
