"""Slack adapter: slack-bolt (Socket Mode or HTTP Events API) in front of the dispatcher."""

from adapters.slack.adapter import SlackAdapter, SlackStartError

__all__ = ["SlackAdapter", "SlackStartError"]
