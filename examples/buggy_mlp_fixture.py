"""The example with a resume bug: state_dict() and load_state_dict() leave out the dropout
generator, so resumed steps draw other dropout masks than the uninterrupted run."""

from examples import mlp_fixture


class App(mlp_fixture.App):
    def state_dict(self):
        sd = super().state_dict()
        del sd["rng"]  # the bug: the generator is not saved...
        return sd

    def load_state_dict(self, sd):
        # ...nor loaded: the fresh app's generator, still at its seed, stays as it is.
        super().load_state_dict({**sd, "rng": self.gen.get_state()})


def fixture(rank, world_size):
    return App(rank, world_size)
