-- A message's turn by the message's id: the REST API's status of a message (`GET
-- /v1/messages/{id}`, the wait of `POST /v1/messages`) and a repeated outbound request look a
-- turn up by `inbound_id`, which no index served: each look-up read every turn ever taken.
CREATE INDEX turns_inbound ON switchboard.turns (inbound_id);
