// Chat Completions, not streamed: the message's text and the response's headers.
import { report, run, setup } from './common.mjs';

await run(async () => {
  const { client, model } = setup();
  const { data: completion, response } = await client.chat.completions
    .create({ model, messages: [{ role: 'user', content: 'say something' }], max_tokens: 8 })
    .withResponse();
  report('chat', false, completion.choices[0]?.message?.content ?? '', response);
});
