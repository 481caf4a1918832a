"""PPO-family algorithms: registered advantage estimators, policy losses and KL controllers."""
