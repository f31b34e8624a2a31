"""The output items of a response, built from a choice's parsed text: whole (items()) or as the
typed server-sent events of a stream (ResponseEvents), each numbered by sequence_number in
the order sent, as OpenAI streams them:

response.created, response.in_progress, then per item output_item.added, its
content_part.added and deltas (output_text.delta, reasoning_text.delta or
function_call_arguments.delta), their .done events and output_item.done, and last
response.completed (response.incomplete when max_output_tokens cut it short).

A message item opens only on text that is not all whitespace (a model writes a newline or two
before a tool call), unless the response would otherwise have no item at all."""

from __future__ import annotations

import json

from minivllm.entrypoints.openai.protocol_tools import DeltaToolCall, ToolCall
from minivllm.entrypoints.openai.responses.protocol import (
    FunctionCallItem,
    OutputItem,
    OutputMessage,
    OutputText,
    ReasoningItem,
    ReasoningText,
    ResponseObject,
)


def items(content: str | None, reasoning: str | None, calls: list[ToolCall],
          incomplete: bool) -> list[OutputItem]:
    """A finished choice's output items: its reasoning, its text, its function calls."""
    out: list[OutputItem] = []
    if reasoning:
        out.append(ReasoningItem(content=[ReasoningText(text=reasoning)]))
    if (content and content.strip()) or not (out or calls):
        out.append(OutputMessage(content=[OutputText(text=content or "")]))
    out += [FunctionCallItem(name=c.function.name, arguments=c.function.arguments)
            for c in calls]
    if incomplete:
        out[-1].status = "incomplete"
    return out


class ResponseEvents:
    def __init__(self, response: ResponseObject) -> None:
        self.response = response
        self.sequence_number = 0
        self.item: OutputItem | None = None  # the item being written
        self.text = ""  # its text (or a call's arguments) so far
        self.pending = ""  # whitespace held back before a message opens

    def _event(self, type_: str, **fields) -> str:
        payload = {"type": type_, "sequence_number": self.sequence_number, **fields}
        self.sequence_number += 1
        return f"event: {type_}\ndata: {json.dumps(payload, ensure_ascii=False)}\n\n"

    def _dump(self, model) -> dict:
        return model.model_dump(mode="json")

    @property
    def _index(self) -> int:
        return len(self.response.output)  # the open item's place: after the closed ones

    def start(self) -> list[str]:
        return [self._event(kind, response=self._dump(self.response))
                for kind in ("response.created", "response.in_progress")]

    def _open(self, item: OutputItem) -> list[str]:
        events = self.close()
        self.item, self.text = item, ""
        item.status = "in_progress"
        events.append(self._event("response.output_item.added", output_index=self._index,
                                  item=self._dump(item)))
        if isinstance(item, OutputMessage):
            events.append(self._part_event("response.content_part.added",
                                           {"type": "output_text", "text": "",
                                            "annotations": [], "logprobs": []}))
        elif isinstance(item, ReasoningItem):
            events.append(self._part_event("response.content_part.added",
                                           {"type": "reasoning_text", "text": ""}))
        return events

    def _part_event(self, type_: str, part: dict) -> str:
        return self._event(type_, item_id=self.item.id, output_index=self._index,
                           content_index=0, part=part)

    def _delta(self, type_: str, delta: str) -> str:
        self.text += delta
        fields = {"content_index": 0} if type_ != "response.function_call_arguments.delta" \
            else {}
        if type_ == "response.output_text.delta":
            fields["logprobs"] = []
        return self._event(type_, item_id=self.item.id, output_index=self._index, delta=delta,
                           **fields)

    def feed(self, content: str, reasoning: str, calls: list[DeltaToolCall]) -> list[str]:
        """The events of one parsed delta (chat_completion/choice_parser.ChoiceParser.feed's)."""
        events: list[str] = []
        if reasoning:
            if not isinstance(self.item, ReasoningItem):
                events += self._open(ReasoningItem())
            events.append(self._delta("response.reasoning_text.delta", reasoning))
        if content:
            if not isinstance(self.item, OutputMessage):
                if not (self.pending + content).strip():
                    self.pending += content
                    content = ""
                else:
                    events += self._open(OutputMessage())
                    content, self.pending = self.pending + content, ""
            if content:
                events.append(self._delta("response.output_text.delta", content))
        for call in calls:
            if call.id is not None:  # a new call: its name first, then its arguments
                events += self._open(FunctionCallItem(name=call.function.name, arguments=""))
            if call.function is not None and call.function.arguments:
                events.append(self._delta("response.function_call_arguments.delta",
                                          call.function.arguments))
        return events

    def close(self, status: str = "completed") -> list[str]:
        """The .done events of the item being written; it joins the response's output."""
        item, text = self.item, self.text
        if item is None:
            return []
        where = {"item_id": item.id, "output_index": self._index}
        events = []
        if isinstance(item, OutputMessage):
            item.content = [OutputText(text=text)]
            events.append(self._event("response.output_text.done", content_index=0, text=text,
                                      logprobs=[], **where))
            events.append(self._part_event("response.content_part.done",
                                           self._dump(item.content[0])))
        elif isinstance(item, ReasoningItem):
            item.content = [ReasoningText(text=text)]
            events.append(self._event("response.reasoning_text.done", content_index=0,
                                      text=text, **where))
            events.append(self._part_event("response.content_part.done",
                                           self._dump(item.content[0])))
        else:
            item.arguments = text
            events.append(self._event("response.function_call_arguments.done",
                                      arguments=text, **where))
        item.status = status
        events.append(self._event("response.output_item.done", output_index=self._index,
                                  item=self._dump(item)))
        self.response.output.append(item)
        self.item, self.text = None, ""
        return events

    def finish(self, incomplete: bool) -> list[str]:
        """Close the last item (a message of the held-back text if there is none) and send
        the finished response."""
        events = []
        if self.item is None and not self.response.output:
            events += self._open(OutputMessage())
            if self.pending:
                events.append(self._delta("response.output_text.delta", self.pending))
        events += self.close("incomplete" if incomplete else "completed")
        kind = "response.incomplete" if incomplete else "response.completed"
        return events + [self._event(kind, response=self._dump(self.response))]

    def error(self, message: str, code: int, param: str | None) -> str:
        return self._event("error", code=str(code), message=message, param=param)
