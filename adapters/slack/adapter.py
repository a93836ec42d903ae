"""The Slack platform edge: slack-bolt in front of the dispatcher.

Bolt receives events over Socket Mode (``slack.app_token`` set) or the HTTP Events API
(``POST /slack/events``, signature-checked by bolt); its middleware drops the bot's own
events. Slack's agent messaging (the Messages tab, the channel in view) is
:mod:`adapters.slack.agent_view`'s. Bolt's ``Assistant`` middleware serves the older AI-app surface: a new assistant thread
gets the greeting and suggested prompts (``slack.assistant``, or the viewed channel's
``suggested_prompts``), and its messages are turns like any thread's, with Slack's status line
and a title from the first question. Each listener only translates: it builds an :class:`~bot.events.InboundMessage`
plus a :class:`SlackOutbox` and hands them to the core (:meth:`PlatformAdapter.dispatch`, a
tracked task), so Slack is acknowledged at once. Whether a message becomes a turn (other bots,
mentions and ``slack.reply_without_mention``, allow-list, duplicates, queueing, budgets) is the
core's one admission chain (``bot.admission``)."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import aiohttp
from aiohttp import web
from slack_bolt.adapter.aiohttp import to_aiohttp_response, to_bolt_request
from slack_bolt.adapter.socket_mode.async_handler import AsyncSocketModeHandler
from slack_bolt.async_app import AsyncApp
from slack_bolt.context.async_context import AsyncBoltContext
from slack_bolt.middleware.assistant.async_assistant import AsyncAssistant
from slack_bolt.middleware.authorization.async_single_team_authorization import AsyncSingleTeamAuthorization
from slack_sdk.web.async_slack_response import AsyncSlackResponse

from adapters.base import AdapterStartError, PlatformAdapter
from adapters.slack.agent_view import ChannelsInView, offer_prompts, viewed_channel_id
from adapters.slack.api import Failure, call, make_client
from adapters.slack.files import FileDownloader
from adapters.slack.inbound import to_inbound
from adapters.slack.layout import NativeSupport
from adapters.slack.lookups import TimezoneBook, thread_open
from adapters.slack.outbox import (
    FEEDBACK_ACTION_ID,
    STOP_ACTION_ID,
    AssistantThread,
    SlackOutbox,
    parse_feedback,
    stopping_text,
)
from adapters.slack.render import mrkdwn, plain
from adapters.slack.sessions import AgentSessions
from adapters.slack.stream import StreamingSupport
from bot.config import ChannelPolicy, SlackSettings, SuggestedPrompt
from bot.events import InboundMessage, ThreadKey

if TYPE_CHECKING:
    from bot.dispatcher import Dispatcher

log = logging.getLogger("threadbook.slack")

EVENTS_PATH = "/slack/events"
#: Assistant threads opened since start-up whose first question names them (bounded).
_MAX_UNTITLED = 10_000
_TITLE_CHARS = 60


class SlackStartError(AdapterStartError):
    """Slack refused the configured credentials at start-up."""


class SlackAdapter(PlatformAdapter):
    """Runs the Slack side of Threadbook (see the module docstring)."""

    def __init__(
        self, settings: SlackSettings, dispatcher: Dispatcher, *, channels: Mapping[str, ChannelPolicy] | None = None
    ) -> None:
        """``channels``: the per-channel policies (for their assistant ``suggested_prompts``)."""
        super().__init__(dispatcher, label="Slack")
        self._settings = settings
        self._channels = dict(channels or {})
        self._streaming = StreamingSupport() if settings.streaming else None
        #: Native block kinds Slack refused, for every outbox of this process.
        self._native = NativeSupport()
        self._untitled: dict[str, None] = {}
        self._token = settings.bot_token.get_secret_value()
        self._client = make_client(self._token, settings.api_url)
        self._timezones = TimezoneBook(self._client)
        self._sessions = AgentSessions(self._client)
        self._in_view = ChannelsInView(self._client)
        self._team_id = ""
        self._bot_user_id = ""
        #: One connection pool for Web API calls and file downloads (slack_sdk opens a new
        #: connection per call when it has no session).
        self._http: aiohttp.ClientSession | None = None
        self._downloader: FileDownloader | None = None
        self._socket: AsyncSocketModeHandler | None = None
        self._runner: web.AppRunner | None = None
        self._port: int | None = None

    @property
    def port(self) -> int | None:
        """The bound port of the Events API endpoint (None in Socket Mode or before start)."""
        return self._port

    @property
    def socket_mode(self) -> bool:
        """True when events arrive over Socket Mode."""
        return bool(self._settings.app_token.get_secret_value())

    async def start(self) -> None:
        """Check the tokens, then connect Socket Mode or start the HTTP endpoint.

        Raises :class:`SlackStartError` (one line naming the setting) when Slack refuses a token.
        """
        self._http = self._client.session = aiohttp.ClientSession()
        self._downloader = FileDownloader(self._http, self._token, api_url=self._settings.api_url)
        try:
            auth = await call("auth.test", self._client.auth_test())
            if isinstance(auth, Failure):
                raise SlackStartError(f"Slack auth.test failed ({auth.error}): check slack.bot_token (SLACK_BOT_TOKEN)")
            self._team_id, self._bot_user_id = str(auth["team_id"]), str(auth["user_id"])
            app = self._build_app(auth)
            socket_url = await self._open_socket_url() if self.socket_mode else None
            if socket_url is not None:
                await self._connect_socket(app, socket_url)
                log.info("Slack: connected over Socket Mode as %s in %s", self._bot_user_id, self._team_id)
            else:
                await self._serve_http(app)
                log.info("Slack: Events API at http://%s:%s%s", self._settings.http_host, self._port, EVENTS_PATH)
        except BaseException:
            await self.stop()
            raise

    async def _stop_intake(self) -> None:
        if self._socket is not None:
            await self._socket.close_async()
            self._socket = None
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _disconnect(self) -> None:
        if self._http is not None:
            await self._http.close()
            self._http = self._client.session = None
            self._downloader = None

    def outbox_for(self, key: ThreadKey) -> SlackOutbox | None:
        """An outbox posting into ``key``'s channel and thread (None for another platform)."""
        # Any workspace: an org-wide (Enterprise Grid) install serves several team ids.
        if key.platform != "slack":
            return None
        return SlackOutbox(
            self._client,
            key=key,
            message_ts="",
            user_id="",
            native=self._native,
            status_after_s=self._settings.status_after_s,
        )

    async def thread_open(self, key: ThreadKey) -> bool:
        """False when Slack says ``key``'s channel or thread is gone or archived (see
        :func:`adapters.slack.lookups.thread_open`)."""
        return key.platform != "slack" or await thread_open(self._client, key)

    def _build_app(self, auth: AsyncSlackResponse) -> AsyncApp:
        app = AsyncApp(
            client=self._client,
            signing_secret=self._settings.signing_secret.get_secret_value(),
            name="threadbook",
            logger=_bolt_logger(),
        )
        _share_auth_test(app, auth)
        assistant = AsyncAssistant(logger=_bolt_logger())
        assistant.thread_started(self._on_assistant_thread_started)
        assistant.user_message(self._on_assistant_message)
        assistant.thread_context_changed(self._on_assistant_context_changed)
        app.assistant(assistant)
        app.event("app_mention")(self._on_message)
        app.event("message")(self._on_message)
        app.event("agent_session_stopped")(self._on_session_stopped)
        app.event("app_home_opened")(self._on_home_opened)
        app.event("app_context_changed")(self._on_context_changed)
        app.action(STOP_ACTION_ID)(self._on_stop)
        app.action(FEEDBACK_ACTION_ID)(self._on_feedback)
        return app

    async def _open_socket_url(self) -> str:
        # Ask for the first websocket URL ourselves: the SDK client would retry a bad app token forever.
        opened = await call(
            "apps.connections.open",
            self._client.apps_connections_open(app_token=self._settings.app_token.get_secret_value()),
        )
        if isinstance(opened, Failure):
            raise SlackStartError(
                f"Slack apps.connections.open failed ({opened.error}): check slack.app_token (SLACK_APP_TOKEN, "
                "an xapp- token with connections:write) and that Socket Mode is enabled for the app"
            )
        return str(opened["url"])

    async def _connect_socket(self, app: AsyncApp, url: str) -> None:
        self._socket = AsyncSocketModeHandler(app, self._settings.app_token.get_secret_value(), web_client=self._client)
        self._socket.client.wss_uri = url
        await self._socket.connect_async()

    async def _serve_http(self, app: AsyncApp) -> None:
        async def events(request: web.Request) -> web.Response:
            response = await app.async_dispatch(await to_bolt_request(request))
            return await to_aiohttp_response(response)

        web_app = web.Application()
        web_app.router.add_post(EVENTS_PATH, events)
        self._runner = web.AppRunner(web_app, handle_signals=False, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self._settings.http_host, self._settings.http_port)
        await site.start()
        self._port = int(self._runner.addresses[0][1])

    async def _on_message(self, event: Mapping[str, Any], context: AsyncBoltContext) -> None:
        self._turn(event, context)

    def _turn(
        self, event: Mapping[str, Any], context: AsyncBoltContext, assistant: AssistantThread | None = None
    ) -> None:
        assert self._downloader is not None
        message = to_inbound(
            event,
            team_id=context.team_id or self._team_id,
            bot_user_id=self._bot_user_id,
            fetcher=self._downloader.fetcher,
        )
        if message is None:
            return
        if not (message.mentioned or message.is_dm or event.get("thread_ts")):
            # A Slack fact, not a rule: a top-level message continues no thread (a session is a
            # thread the bot answered in, and this message starts a new one), so without a
            # mention outside a DM it can never be for the bot. Dropped here, it costs no task
            # and no store lookup; which messages become turns stays bot/admission.py's to say.
            return
        if message.user_id and not message.is_bot:
            user_id = message.user_id
            message = dataclasses.replace(
                message,
                timezone=lambda: self._timezones.of(user_id),
                member_of=(lambda channel: self._in_view.member(channel, user_id)) if message.is_dm else None,
            )
        # Only a DM thread's first message (a top-level one) can take the viewed channel's policy.
        first_in_dm = message.is_dm and not message.is_bot and not event.get("thread_ts")
        viewed = self._viewed_for(event, message.user_id) if first_in_dm else None
        outbox = SlackOutbox(
            self._client,
            key=message.key,
            message_ts=str(event["ts"]),
            user_id=message.user_id,
            turn_id=message.message_id,
            streaming=self._streaming,
            native=self._native,
            assistant=assistant,
            sessions=self._sessions,
            question=message.text,
            status_after_s=self._settings.status_after_s,
        )
        if viewed is not None:
            self._tasks.spawn(self._dispatch_viewing(message, outbox, viewed), name=f"slack turn {message.message_id}")
        else:
            self.dispatch(message, outbox, name=f"slack turn {message.message_id}")

    def _viewed_for(self, event: Mapping[str, Any], user: str) -> str | None:
        """The channel a DM's author views, where it has a policy to lend: the message's own
        ``app_context``, else the last ``app_context_changed`` this replica saw for them."""
        channel = viewed_channel_id(event.get("app_context")) or self._in_view.viewed_by(user)
        return channel if channel is not None and f"slack:{channel}" in self._channels else None

    async def _dispatch_viewing(self, message: InboundMessage, outbox: SlackOutbox, channel: str) -> None:
        """Ask Slack whether the author is a member of the channel they view, then hand on the turn."""
        viewing = await self._in_view.describe(channel, message.user_id)
        await self.dispatch(
            dataclasses.replace(message, viewing=viewing), outbox, name=f"slack turn {message.message_id}"
        )

    async def _on_home_opened(self, event: Mapping[str, Any], context: AsyncBoltContext) -> None:
        """The app's Messages tab was opened: greet the person the first time ever (remembered in
        the store, so reopening, restarts and replicas post nothing more) and offer the prompts."""
        if event.get("tab") != "messages":
            return
        user, dm = str(event.get("user") or ""), str(event.get("channel") or "")
        if not user or not dm:
            return
        if (viewed := viewed_channel_id(event.get("app_context"))) is not None:
            self._in_view.remember(user, viewed)
        self._tasks.spawn(self._welcome(context.team_id or self._team_id, dm, user), name=f"slack home {user}")

    async def _welcome(self, team: str, dm: str, user: str) -> None:
        greet = await self._dispatcher.first_visit(platform="slack", workspace=team, channel=dm, user_id=user)
        if greet:
            await call(
                "chat.postMessage",
                self._client.chat_postMessage(channel=dm, text=mrkdwn(self._settings.assistant.greeting).text),
            )
        if greet or self._dispatcher.may_open(platform="slack", channel=dm, user_id=user):
            await offer_prompts(self._client, dm, self._prompts_for(self._in_view.viewed_by(user) or ""))

    async def _on_context_changed(self, event: Mapping[str, Any]) -> None:
        """The person looks at another channel (or canvas, or message): remember it, and offer
        that channel's prompts in their DM with the app."""
        user, dm = str(event.get("user") or ""), str(event.get("channel") or "")
        if not user:
            return
        viewed = viewed_channel_id(event.get("context"))
        self._in_view.remember(user, viewed)
        if dm and self._dispatcher.may_open(platform="slack", channel=dm, user_id=user):
            prompts = self._prompts_for(viewed or "")
            self._tasks.spawn(offer_prompts(self._client, dm, prompts), name=f"slack prompts {user}")

    async def _on_assistant_thread_started(self, event: Mapping[str, Any]) -> None:
        """A new assistant thread: greet, offer prompts, and name it after its first question."""
        thread = event.get("assistant_thread") or {}
        channel, thread_ts = str(thread.get("channel_id") or ""), str(thread.get("thread_ts") or "")
        if not channel or not thread_ts:
            return
        self._untitled[thread_ts] = None
        while len(self._untitled) > _MAX_UNTITLED:
            self._untitled.pop(next(iter(self._untitled)))
        viewed = str((thread.get("context") or {}).get("channel_id") or "")
        prompts = self._prompts_for(viewed)
        await call(
            "chat.postMessage",
            self._client.chat_postMessage(
                channel=channel, thread_ts=thread_ts, text=mrkdwn(self._settings.assistant.greeting).text
            ),
        )
        if prompts:
            await call(
                "assistant.threads.setSuggestedPrompts",
                self._client.assistant_threads_setSuggestedPrompts(
                    channel_id=channel,
                    thread_ts=thread_ts,
                    prompts=[{"title": plain(p.title), "message": p.message} for p in prompts],
                ),
            )

    async def _on_assistant_message(self, event: Mapping[str, Any], context: AsyncBoltContext) -> None:
        """A message in an assistant thread: a turn like any, with Slack's status line."""
        thread_ts = str(event.get("thread_ts") or "")
        title = None
        if thread_ts in self._untitled:
            del self._untitled[thread_ts]
            words = " ".join(str(event.get("text") or "").split())
            title = (words[: _TITLE_CHARS - 1] + "…" if len(words) > _TITLE_CHARS else words) or None
        self._turn(event, context, AssistantThread(title=title))

    async def _on_assistant_context_changed(self, event: Mapping[str, Any]) -> None:
        """The user moved to another channel with the side panel open; the prompts were given already."""
        log.debug("Slack: assistant thread context changed: %s", (event.get("assistant_thread") or {}).get("context"))

    def _prompts_for(self, channel: str) -> tuple[SuggestedPrompt, ...]:
        policy = self._channels.get(f"slack:{channel}") if channel else None
        if policy is not None and policy.suggested_prompts is not None:
            return policy.suggested_prompts
        return self._settings.assistant.prompts

    async def _on_feedback(self, ack: Any, body: Mapping[str, Any], action: Mapping[str, Any]) -> None:
        await ack()
        parsed = parse_feedback(str(action.get("value", "")))
        user = str((body.get("user") or {}).get("id") or "")
        if parsed is None or parsed[1].platform != "slack" or not user:
            log.warning("Slack: feedback click with a bad value %r", action.get("value"))
            return
        good, key, turn_id = parsed
        self._tasks.spawn(self._dispatcher.feedback(key, turn_id, user, good), name=f"slack feedback {turn_id}")

    async def _on_stop(self, ack: Any, body: Mapping[str, Any], action: Mapping[str, Any]) -> None:
        await ack()
        try:
            key = ThreadKey.parse(str(action.get("value", "")))
        except ValueError:
            log.warning("Slack: Stop button with a bad value %r", action.get("value"))
            return
        user = str((body.get("user") or {}).get("id") or "")
        if key.platform != "slack" or not self._dispatcher.may_stop(key, user):
            return
        container = body.get("container") or {}
        if container.get("message_ts"):
            await call(
                "chat.update",
                self._client.chat_update(
                    channel=str(container.get("channel_id") or key.channel),
                    ts=str(container["message_ts"]),
                    text=stopping_text(body).text,
                    blocks=[],
                ),
            )
        self._tasks.spawn(self._stop_turn(key, user), name=f"slack stop {key}")

    async def _stop_turn(self, key: ThreadKey, user: str) -> None:
        if not await self._dispatcher.stop(key, user_id=user):
            log.info("Slack: Stop clicked in %s but no turn was running", key)

    async def _on_session_stopped(self, event: Mapping[str, Any], context: AsyncBoltContext) -> None:
        """Slack's own Stop on an agent session: stop the thread's turn as our Stop button does
        (the turn's end sets the session back to active; with no turn running, it is set here)."""
        channel, thread_ts = str(event.get("channel") or ""), str(event.get("thread_ts") or "")
        team = context.team_id or self._team_id
        if not channel or not thread_ts or not team:
            log.warning("Slack: agent_session_stopped without a channel or thread: %r", dict(event))
            return
        key = ThreadKey("slack", team, channel, thread_ts)
        user = str(event.get("user") or "")
        log.info("Slack: session stopped by %s in %s", user, key)
        if self._dispatcher.may_stop(key, user):
            self._tasks.spawn(self._stop_session(key, user), name=f"slack session stop {key}")
        elif self._dispatcher.running(key):  # Slack shows the session stopped; the turn goes on
            self._tasks.spawn(self._sessions.resume(channel, thread_ts), name=f"slack session resume {key}")

    async def _stop_session(self, key: ThreadKey, user: str) -> None:
        if not await self._dispatcher.stop(key, user_id=user):
            await self._sessions.done(key.channel, key.thread)


def _bolt_logger() -> logging.Logger:
    """bolt's logger, minus its start-up warning that SLACK_BOT_TOKEN in the environment is
    unused next to our client (the client carries that very token)."""
    logger = logging.getLogger("threadbook.slack.bolt")
    if not logger.filters:
        logger.addFilter(lambda record: not record.getMessage().startswith("As you gave `client` as well"))
    return logger


def _share_auth_test(app: AsyncApp, auth: AsyncSlackResponse) -> None:
    """Hand bolt the ``auth.test`` answer the adapter got at start. Bolt's single-workspace
    authorization asks for it on its first event and caches it, but every event that arrives
    before that first answer asks again: a crowd of new threads made one ``auth.test`` each."""
    for middleware in app._async_middleware_list:  # bolt offers no public way to seed its cache
        if isinstance(middleware, AsyncSingleTeamAuthorization):
            middleware.auth_test_result = auth
