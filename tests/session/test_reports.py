"""Reports name the loss they are of, and configure() says what it changed and what that needed."""


def test_loss_and_train_reports_name_the_active_loss_and_configure_prints_the_change(session, capsys):
    batch = session.advantages(session.logprobs(session.score(session.rollout())))
    before = session.loss(batch)
    assert before.loss_fn == "RLLoss(ppo_clip, clip=(0.2, 0.2), aggregation=token_mean)"
    assert repr(before).startswith("LossReport(loss_fn=RLLoss(ppo_clip, clip=(0.2, 0.2), aggregation=token_mean), loss=")
    assert "<b>RLLoss(ppo_clip, clip=(0.2, 0.2), aggregation=token_mean)</b>" in before._repr_html_()
    capsys.readouterr()

    session.configure(["loss_fn.policy_loss=gspo", "loss_fn.ratio_clip_max=0.0004", "grpo.val_period=5"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "configure(): 5 setting(s) changed"  # + GSPO's companions: ratio_clip_min, aggregation
    changed = {line.split()[0]: line.split(None, 1)[1] for line in lines[1:]}
    assert changed["loss_fn.policy_loss"].startswith("'ppo_clip' -> 'gspo'")
    new_loss = "new loss: RLLoss(gspo, clip=(0.0003, 0.0004), aggregation=seq_mean_token_mean)"
    assert changed["loss_fn.policy_loss"].endswith(new_loss)
    assert changed["loss_fn.ratio_clip_min"].startswith("0.2 -> 0.0003")  # from the gspo preset; the max named wins
    assert "brought its companion settings from the gspo preset" in lines[-1]
    assert changed["loss_fn.ratio_clip_max"].startswith("0.2 -> 0.0004")
    assert changed["grpo.val_period"].startswith("0 -> 5") and changed["grpo.val_period"].endswith("live: read at its next use")

    after = session.loss(batch)
    assert after.loss_fn == "RLLoss(gspo, clip=(0.0003, 0.0004), aggregation=seq_mean_token_mean)"
    session.train(batch)
    assert session.last_train.loss_fn == after.loss_fn
    assert "of RLLoss(gspo, clip=(0.0003, 0.0004)" in repr(session.last_train)

    session.configure([])
    assert capsys.readouterr().out == "configure(): nothing changed\n"


def test_configure_says_a_loss_of_your_own_is_kept(session, capsys):
    saved = session.loss_fn

    def my_loss(logprobs, batch, counts):
        return saved(logprobs, batch, counts)

    session.loss_fn = my_loss
    try:
        session.configure(["loss_fn.ratio_clip_min=0.1"])
        out = capsys.readouterr().out
        assert "your loss function is kept: the change does not reach it" in out
        session.refit()
        batch = session.advantages(session.logprobs(session.score(session.rollout())))
        assert session.loss(batch).loss_fn == "my_loss"
    finally:
        session.loss_fn = saved
