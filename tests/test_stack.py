"""The installed stack holds together where the fast tests would not notice otherwise.

These run in both stacks that CI checks: `make test` (constraints.txt, TensorFlow 2.21) and
`make test-container-stack` (constraints-container.txt, the Docker base image's TensorFlow 2.17).
"""


def test_tensorboard_server_loads_with_the_xprof_profile_plugin():
    # No fast test starts a TensorBoard server. TensorBoard 2.17's server module imports
    # pkg_resources, which setuptools 82 and later no longer ship: without the setuptools pin in
    # constraints-container.txt `make tensorboard` fails there while every fast test passes.
    from tensorboard import program

    board = program.TensorBoard()
    modules = {type(loader).__module__ for loader in board.plugin_loaders}
    assert any(module.startswith("xprof.") for module in modules), sorted(modules)
